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
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote
from typing import Any, TypeVar

import pydantic_core
import sqlalchemy as sa

from coevo.errors import CoevoError

T = TypeVar("T")

DEFAULT_URL = "sqlite:///./coevo.db"
_WAIT = {"timeout": 30.0}  # pysqlite's busy wait while connecting (its default is 5 s)
LOCKED_RETRY_S = 60.0  # how long opening a store retries a lock SQLite did not wait for


# Query parameters a store URL may carry; anything else is a typo that would be ignored.
SQLITE_QUERY = frozenset({"mode", "uri", "cache", "timeout", "immutable", "nolock"})
POSTGRES_QUERY = frozenset({
    "sslmode", "sslcert", "sslkey", "sslrootcert", "sslpassword", "sslcrl", "connect_timeout",
    "application_name", "options", "target_session_attrs", "client_encoding", "keepalives",
    "keepalives_idle", "keepalives_interval", "keepalives_count", "gssencmode", "passfile",
    "service", "host", "port", "hostaddr", "channel_binding", "tcp_user_timeout",
})
def resolve_url(url: str | None = None) -> str:
    """The database URL: argument, else $COEVO_DB, else ./coevo.db. A plain path means SQLite;
    `postgresql://` means PostgreSQL through psycopg 3 (the driver coevo depends on). A URL
    that would open something other than what it names (an empty one, an in-memory database,
    an unknown kind or query parameter, a bad port) is a CoevoError naming it."""
    where = "--db" if url is not None else "$COEVO_DB"
    if url is None:
        url = os.environ.get("COEVO_DB")
        if url is None:
            url = DEFAULT_URL
            where = "default store"
    if not url.strip():
        raise CoevoError(f"{where}: empty; give a SQLite file path or a postgresql:// URL")
    if "://" not in url:
        if url == ":memory:":
            raise CoevoError(f"{where} {url!r}: an in-memory store keeps nothing; give a file path")
        # URL.create quotes what URL syntax would misread (`%`, `:`, `?`, `#` in a file name)
        path = str(Path(url).expanduser().resolve())
        return check_url(sa.URL.create("sqlite", database=path).render_as_string(False), where)
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix):]
    return check_url(url, where)


def check_url(url: str, where: str = "--db") -> str:
    """`url` when it names a SQLite file or a PostgreSQL database with known parameters."""
    try:
        u = sa.make_url(url)
        u.port  # noqa: B018  (a non-numeric port fails here, not at connect time)
    except sa.exc.ArgumentError as e:
        raise CoevoError(f"{where}: database URL {_safe(url)}: cannot parse it ({e})") from None
    except ValueError:  # sqlalchemy's int() of the port
        raise CoevoError(f"{where}: database URL {_safe(url)}: the port is not a number") from None
    kind = u.get_backend_name()
    if kind not in ("sqlite", "postgresql"):
        raise CoevoError(f"{where}: database URL {_safe(url)}: unsupported kind {kind!r}; coevo stores "
                         "in SQLite (a file path) or PostgreSQL (postgresql://...)")
    known = SQLITE_QUERY if kind == "sqlite" else POSTGRES_QUERY
    unknown = sorted(set(u.query) - known)
    if unknown:
        raise CoevoError(f"{where}: database URL {_safe(url)}: unknown parameter {unknown[0]!r}; "
                         f"known: {', '.join(sorted(known))}")
    if kind == "sqlite" and (not u.database or u.database == ":memory:"):
        raise CoevoError(f"{where}: database URL {_safe(url)}: an in-memory store keeps nothing; "
                         "give a file path")
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
        return _sqlite_settings(sa.create_engine(u, connect_args=_WAIT, **json_args), "BEGIN",
                                "busy_timeout=30000", "query_only=ON")
    _check_sqlite_path(u.database, url)
    # WAL + synchronous NORMAL: a power cut may lose the last commits, never corrupts.
    # busy_timeout first: the journal_mode switch below waits for a lock too.
    return _sqlite_settings(sa.create_engine(u, connect_args=_WAIT, **json_args), "BEGIN IMMEDIATE",
                            "busy_timeout=30000", "foreign_keys=ON", "journal_mode=WAL",
                            "synchronous=NORMAL")


def _check_sqlite_path(database: str, url: str) -> None:
    """Create the folder of a SQLite store; a folder, or a path that cannot be created, is a
    CoevoError naming it (a `file:` URI is SQLite's own business)."""
    if database.startswith("file:"):
        return
    path = Path(database)
    if path.is_dir():
        raise CoevoError(f"store {_safe(url)}: {path} is a folder, not a SQLite file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CoevoError(f"store {_safe(url)}: cannot create the folder {path.parent}: "
                         f"{e.strerror or e}") from None
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise CoevoError(f"store {_safe(url)}: cannot create {path}: the folder is not writable")
    if path.is_file() and path.stat().st_size:
        _check_sqlite_file(path, _safe(url))


def _check_sqlite_file(path: Path, url: str) -> None:
    """Read the tables of an existing file without writing to it (coevo's own connections would
    switch it to WAL first): not a database, or another application's database, is refused."""
    try:
        con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise CoevoError(f"store {url}: cannot open {path}: {e}") from None
    if tables and "alembic_version" not in tables:
        raise not_coevo(url, tables)


def not_coevo(url: str, tables: list[str]) -> CoevoError:
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    return CoevoError(f"store {url}: not a coevo store: it holds other tables ({shown}) and no "
                      "coevo schema; give a new file or an empty database")


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


def is_locked(e: BaseException) -> bool:
    """SQLite's "database is locked" / "database table is locked" (SQLITE_BUSY / _LOCKED)."""
    return "is locked" in str(getattr(e, "orig", e))


def retry_locked(fn: Callable[[], T], deadline: float = LOCKED_RETRY_S) -> T:
    """`fn()`, run again while it fails with SQLite's "database is locked", for up to `deadline`
    seconds. SQLite returns SQLITE_BUSY without calling the busy handler in some moments of
    another process's life: while it cleans up the WAL as the last connection closes, while it
    recovers a WAL left by a crash, while it switches a new file to WAL (sqlite.org/wal.html,
    "Sometimes Queries Return SQLITE_BUSY In WAL Mode"); two runs starting on one new store
    meet these moments. Any other error, and a lock that outlasts the deadline, propagate."""
    end, pause = time.monotonic() + deadline, 0.05
    while True:
        try:
            return fn()
        except sa.exc.OperationalError as e:
            if not is_locked(e) or time.monotonic() + pause > end:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


def db_failure(url: str, e: sa.exc.DBAPIError) -> CoevoError:
    """A CoevoError for a database that cannot be reached or written: unreachable server,
    read-only file, a file that is not a database."""
    reason = str(getattr(e, "orig", e))
    if "readonly" in reason or "read-only" in reason or "read only" in reason:
        return CoevoError(f"store {url}: the store is read-only ({reason})")
    return CoevoError(f"store {url}: {e.__class__.__name__}: {reason}")


def _to_json(value: Any) -> str:
    return pydantic_core.to_json(value).decode()


def _safe(url: str) -> str:
    """The URL with any password masked, for error messages."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return repr(url)
