"""Connecting to the store's database: URL resolution and engine settings.

SQLite (the default, one file) or PostgreSQL through psycopg 3, by URL. SQLite connections get
foreign keys on, the WAL journal, a 30 s busy timeout and an explicit `BEGIN IMMEDIATE` per
transaction. pysqlite's own transaction handling would run DDL outside any transaction (a
failed migration left half-applied) and would upgrade a reader to a writer lazily, which in WAL
mode fails at once with "database is locked" instead of waiting; taking the write lock up front
makes concurrent writers (Ray workers) queue, which SQLite makes them do anyway. The price:
read-only transactions queue behind writers too.
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


def make_engine(url: str) -> sa.Engine:
    """An engine with coevo's connection settings (see the module docstring for SQLite)."""
    # JSON columns go through pydantic-core's Rust encoder: 3-5x faster than json.dumps on the
    # trajectory insert path, and it serialises pydantic models (a trajectory's turns) as they
    # are. NaN / inf become null (PostgreSQL's JSONB rejects them anyway).
    json_args = {"json_serializer": _to_json, "json_deserializer": pydantic_core.from_json}
    try:
        u = sa.make_url(url)
        if u.get_backend_name() != "sqlite":
            return sa.create_engine(u, pool_pre_ping=True, **json_args)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as e:
        raise CoevoError(f"database URL {_safe(url)} (argument or $COEVO_DB): {e}") from None
    if u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, **json_args)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a power cut may lose the last commits, never corrupts
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _to_json(value: Any) -> str:
    return pydantic_core.to_json(value).decode()


def _safe(url: str) -> str:
    """The URL with any password masked, for error messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return repr(url)
