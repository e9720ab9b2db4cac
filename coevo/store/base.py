"""The store's shared plumbing: one session per thread, transactions, and the lookups every
part of the store needs (a run by id or name, a round, referenced asset versions).

The store is split by concern into mixins over this base (assets.py, runs.py, episodes.py,
proposals.py, reviews.py); coevo/store/store.py composes them into `Store`, which adds opening and the
schema. Only these modules talk SQL.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from coevo.errors import CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.engine import db_failure

MIN_PREFIX = 4  # shorter hash / id prefixes are too likely to be ambiguous to be useful


def is_hex(ref: str) -> bool:
    """`ref` could be a hash, an id or a prefix of one (lowercase hex digits only)."""
    return bool(ref) and all(c in "0123456789abcdef" for c in ref)


def new_id() -> str:
    return uuid.uuid4().hex


class StoreBase:
    """A handle on one database. Thread-safe: each thread gets its own session."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._local = threading.local()

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    # --- transactions ----------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One atomic unit of work. Store calls made inside it join it; on any exception
        everything written inside is rolled back. Yields the session (store-internal use)."""
        outer = getattr(self._local, "session", None)
        if outer is not None:
            yield outer
            return
        try:
            with self._sessions.begin() as session:
                self._local.session = session
                try:
                    yield session
                finally:
                    self._local.session = None
        except sa.exc.IntegrityError as e:
            raise CoevoError(f"{self.url}: the store rejected the write: {e.orig}") from None
        except sa.exc.OperationalError as e:  # read-only file, server gone, disk full
            raise db_failure(self.url, e) from None

    # --- lookups shared by the parts -----------------------------------------------------

    def _run(self, s: Session, ref: str) -> T.Run:
        row = s.get(T.Run, ref) or s.execute(sa.select(T.Run).where(T.Run.name == ref)).scalar()
        if row is None:
            raise NotFound(f"no run with id or name {ref!r}")
        return row

    def _round(self, s: Session, run_id: str, index: int) -> T.Round:
        row = s.execute(sa.select(T.Round).where(T.Round.run_id == run_id,
                                                 T.Round.index == index)).scalar()
        if row is None:
            raise NotFound(f"run {run_id} has no round {index} (start_round first)")
        return row

    def _run_round(self, s: Session, run: str | None, round: int | None) -> tuple[str | None, int | None]:
        """Resolve a (run ref, round index) pair to stored keys, checking both exist."""
        if run is None:
            if round is not None:
                raise CoevoError(f"round {round} given without a run")
            return None, None
        run_id = self._run(s, run).id
        if round is not None:
            self._round(s, run_id, round)
        return run_id, round

    def _check_assets(self, s: Session, what: str, refs: dict[str, str | None],
                      checkpoint: str | None = None) -> dict[str, str | None]:
        """Fail with a readable error (not an IntegrityError) when a referenced asset version
        or checkpoint is not stored. Refs must be full hashes: a record pins exact versions."""
        wanted = {h for h in refs.values() if h is not None}
        if wanted:
            av = T.AssetVersion.__table__
            have = set(s.execute(sa.select(av.c.hash).where(av.c.hash.in_(wanted))).scalars())
            for field, h in refs.items():
                if h is not None and h not in have:
                    raise NotFound(f"{what}: {field} {h[:12]} is not in the store "
                                   "(put_asset it first; references are full hashes)")
        if checkpoint is not None and s.get(T.Checkpoint, checkpoint) is None:
            raise NotFound(f"{what}: checkpoint {checkpoint!r} is not in the store")
        return refs

