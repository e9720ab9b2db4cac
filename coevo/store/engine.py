"""Connecting to the store's database: URL resolution and engine settings.

SQLite (the default, one file) or PostgreSQL through psycopg 3, by URL. SQLite connections get
foreign keys on, the WAL journal, a 30 s busy timeout and an explicit `BEGIN IMMEDIATE` per
transaction. pysqlite's own transaction handling would run DDL outside any transaction (a
failed migration left half-applied) and would upgrade a reader to a writer lazily, which in WAL
mode fails at once with "database is locked" instead of waiting; taking the write lock up front
makes concurrent writers (Ray workers) queue, which SQLite makes them do anyway. The price:
read-only transactions queue behind writers too.

A read-only engine (`readonly=True`, what `coevo serve` opens) is the opposite: plain deferred
`BEGIN` (in WAL mode a reader never waits for, nor blocks, the loop's writers) and
`PRAGMA query_only`, so SQLite itself refuses any write; on PostgreSQL every transaction is
`READ ONLY`. It neither creates a missing SQLite file nor changes the journal mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic_core
import sqlalchemy as sa

from coevo.errors import CoevoError

DEFAULT_URL = "sqlite:///./coevo.db"


def resolve_url(url: str | None = None) -> str:
    """The database URL: argument, else $COEVO_DB, else ./coevo.db. A plain path means SQLite;
    `postgresql://` means PostgreSQL through psycopg 3 (the driver coevo depends on)."""
    url = url or os.environ.get("COEVO_DB") or DEFAULT_URL
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str, readonly: bool = False) -> sa.Engine:
    """An engine with coevo's connection settings (see the module docstring for SQLite and for
    `readonly`)."""
    # JSON columns go through pydantic-core's Rust encoder: 3-5x faster than json.dumps on the
    # trajectory insert path, and it serialises pydantic models (a trajectory's turns) as they
    # are. NaN / inf become null (PostgreSQL's JSONB rejects them anyway).
    json_args = {"json_serializer": _to_json, "json_deserializer": pydantic_core.from_json}
    try:
        u = sa.make_url(url)
        if u.get_backend_name() != "sqlite":
            if readonly:
                json_args["connect_args"] = {"options": "-c default_transaction_read_only=on"}
            return sa.create_engine(u, pool_pre_ping=True, **json_args)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as e:
        raise CoevoError(f"database URL {_safe(url)} (argument or $COEVO_DB): {e}") from None
    if readonly:
        if not u.database or u.database == ":memory:" or not Path(u.database).is_file():
            raise CoevoError(f"no store at {_safe(url)}: the file does not exist "
                             "(coevo init or coevo quickstart creates one)")
        return _sqlite_settings(sa.create_engine(u, **json_args), "BEGIN",
                                "query_only=ON", "busy_timeout=30000")
    if u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    # WAL + synchronous NORMAL: a power cut may lose the last commits, never corrupts.
    return _sqlite_settings(sa.create_engine(u, **json_args), "BEGIN IMMEDIATE", "foreign_keys=ON",
                            "journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000")


def _sqlite_settings(engine: sa.Engine, begin: str, *pragmas: str) -> sa.Engine:
    """Run `pragmas` on every new connection and open each transaction with `begin`
    (pysqlite's own transaction handling is off: see the module docstring)."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        for pragma in pragmas:
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)

    return engine


def _to_json(value: Any) -> str:
    return pydantic_core.to_json(value).decode()


def _safe(url: str) -> str:
    """The URL with any password masked, for error messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return repr(url)
