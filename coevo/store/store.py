"""coevo's audit store: this package (coevo/store/) is the only code in coevo that talks SQL.

Everything the loop produces (asset versions, runs and rounds, checkpoints, trajectories,
evaluations, proposals, gate decisions with their evidence, budget charges) is written here,
append-only, so a run can be audited with SQL and resumed after a crash.

Design:
- SQLite (default, one file) or PostgreSQL, by URL (`Store.open`). Opening applies the alembic migrations
  shipped inside the package (no alembic.ini needed, so it works from an installed wheel).
- Every public method runs in one transaction; `transaction()` lets a caller group several
  calls into one (they join the outer transaction), so a failure leaves nothing half-written.
- Connection settings (SQLite pragmas, explicit BEGIN IMMEDIATE) are in engine.py; row <->
  record conversions in records.py; the schema in tables.py; the `Store` API is split by
  concern into assets.py, runs.py, episodes.py, proposals.py and reviews.py over base.py.
- Lineage is a recursive CTE over `asset_versions.parent_hash`, not a walk in Python.
- Trajectories are inserted with one executemany per batch; per-token arrays are packed blobs
  (coevo/store/codec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from coevo.errors import CoevoError
from coevo.store.assets import AssetStore
from coevo.store.engine import db_failure, make_engine, not_coevo, resolve_url, retry_locked
from coevo.store.episodes import EpisodeStore
from coevo.store.lease import LeaseStore
from coevo.store.proposals import ProposalStore
from coevo.store.reviews import ReviewStore
from coevo.store.runs import RunStore

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_PG_MIGRATION_LOCK = 0x636F65766F  # "coevo": serialises concurrent first opens on one server


class Store(AssetStore, RunStore, EpisodeStore, ProposalStore, ReviewStore, LeaseStore):
    """A handle on one database (thread-safe: each thread gets its own session). The parts are
    split by concern: assets.py, runs.py (runs, rounds, checkpoints, budgets), episodes.py
    (trajectories, evaluations), proposals.py (proposals, decisions, evidence), reviews.py
    (human reviews), lease.py (who executes a run); base.py holds
    the session and transaction plumbing they share."""

    # --- opening and schema -----------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, *, migrate: bool = True) -> "Store":
        """Open (and by default migrate to the newest schema) the database at `url`."""
        store = cls(make_engine(resolve_url(url)))
        store.check_is_coevo()
        if migrate:
            store.upgrade()
        return store

    def check_is_coevo(self) -> None:
        """Refuse a database that holds tables but not coevo's schema (another application's
        SQLite file, a shared PostgreSQL database): migrating would add coevo's tables to it.
        A file that is not a database, or a server that cannot be reached, fails here too."""
        def tables_now() -> list[str]:
            with self.engine.connect() as conn:
                return sa.inspect(conn).get_table_names()

        try:
            tables = retry_locked(tables_now)
        except sa.exc.DBAPIError as e:
            self.engine.dispose()
            raise db_failure(self.url, e) from None
        if tables and "alembic_version" not in tables:
            self.engine.dispose()
            raise not_coevo(self.url, tables)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _alembic(self, connection: sa.Connection | None = None) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        # configparser reads `%` as interpolation: a `%` in a password must be doubled
        cfg.set_main_option("sqlalchemy.url",
                            self.engine.url.render_as_string(False).replace("%", "%%"))
        cfg.attributes["connection"] = connection
        return cfg

    def head_revision(self) -> str:
        """The newest schema revision this version of coevo knows."""
        return ScriptDirectory.from_config(self._alembic()).get_current_head()

    def current_revision(self) -> str | None:
        """The database's schema revision (None: a blank database)."""
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def upgrade(self, revision: str = "head") -> None:
        """Apply migrations up to `revision` in one transaction (`coevo db upgrade`)."""
        def migrate() -> None:
            with self.engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                                 {"k": _PG_MIGRATION_LOCK})
                command.upgrade(self._alembic(conn), revision)

        try:
            retry_locked(migrate)  # one transaction: a locked try left nothing behind
        except CommandError as e:
            raise CoevoError(
                f"{self.url}: cannot migrate the schema to {revision!r}: {e} "
                f"(this coevo's newest revision is {self.head_revision()})") from None
        except sa.exc.OperationalError as e:
            raise db_failure(self.url, e) from None
        except sa.exc.SQLAlchemyError as e:
            raise CoevoError(f"{self.url}: migration failed: {e.__class__.__name__}: "
                             f"{getattr(e, 'orig', e)}") from None

