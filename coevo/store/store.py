"""coevo's audit store: the only code in coevo that talks SQL.

Everything the loop produces (asset versions, runs and rounds, checkpoints, trajectories,
evaluations, proposals, gate decisions with their evidence, budget charges) is written here,
append-only, so a run can be audited with SQL and resumed after a crash.

Design:
- SQLite (default, one file) or PostgreSQL, by URL (`Store.open`). Opening applies the alembic migrations
  shipped inside the package (no alembic.ini needed, so it works from an installed wheel).
- Every public method runs in one transaction; `transaction()` lets a caller group several
  calls into one (they join the outer transaction), so a failure leaves nothing half-written.
- Connection settings (SQLite pragmas, explicit BEGIN IMMEDIATE) are in engine.py; row <->
  record conversions in records.py; the schema in tables.py.
- Lineage is a recursive CTE over `asset_versions.parent_hash`, not a walk in Python.
- Trajectories are inserted with one executemany per batch; per-token arrays are packed blobs
  (coevo/store/codec.py).
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.orm import Session, sessionmaker

from coevo.assets.base import ASSET_TYPES, Asset
from coevo.errors import Ambiguous, CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.engine import make_engine, resolve_url
from coevo.store.records import (
    PROPOSAL_STATUSES,
    AssetRecord,
    CheckpointRecord,
    DecisionRecord,
    EvaluationRecord,
    EvidenceRow,
    ProposalRecord,
    ResultRow,
    RoundRecord,
    RunRecord,
    asset_record,
    checkpoint_record,
    proposal_record,
    round_record,
    run_record,
    trajectory_from_row,
    trajectory_row,
)
from coevo.trajectory import Trajectory

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_MIN_PREFIX = 4  # shorter hash prefixes are too likely to be ambiguous to be useful
_PG_MIGRATION_LOCK = 0x636F65766F  # "coevo": serialises concurrent first opens on one server
_ASSET_REFS = ("harness", "skill_library", "rubric")


def _new_id() -> str:
    return uuid.uuid4().hex


def _asset_class(kind: str) -> type[Asset]:
    if kind not in ASSET_TYPES:
        # The asset classes register themselves on import; the store may be used before
        # anything imported them (e.g. `coevo harness show`).
        try:
            importlib.import_module("coevo.assets")
        except ImportError:
            pass
    try:
        return ASSET_TYPES[kind]
    except KeyError:
        known = ", ".join(sorted(ASSET_TYPES)) or "(none)"
        raise NotFound(f"no asset class for stored kind {kind!r}; known: {known}") from None


class Store:
    """A handle on one database. Thread-safe: each thread gets its own session."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._local = threading.local()

    # --- opening and schema -----------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, *, migrate: bool = True) -> "Store":
        """Open (and by default migrate to the newest schema) the database at `url`."""
        store = cls(make_engine(resolve_url(url)))
        if migrate:
            store.upgrade()
        return store

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def _alembic(self, connection: sa.Connection | None = None) -> Config:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.set_main_option("sqlalchemy.url", self.engine.url.render_as_string(False))
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
        try:
            with self.engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                                 {"k": _PG_MIGRATION_LOCK})
                command.upgrade(self._alembic(conn), revision)
        except CommandError as e:
            raise CoevoError(
                f"{self.url}: cannot migrate the schema to {revision!r}: {e} "
                f"(this coevo's newest revision is {self.head_revision()})") from None
        except sa.exc.SQLAlchemyError as e:
            raise CoevoError(f"{self.url}: migration failed: {e.__class__.__name__}: "
                             f"{getattr(e, 'orig', e)}") from None

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

    # --- assets ------------------------------------------------------------------------------

    def put_asset(self, asset: Asset) -> str:
        """Store a version; returns its hash. Idempotent: existing content returns the existing
        version (its recorded parent is kept). The parent must already be stored. A skill
        library's member skills (Asset objects in `.skills`) are stored first and recorded."""
        with self.transaction() as s:
            members = self._library_members(asset)
            h = asset.hash
            av = T.AssetVersion.__table__
            if s.execute(sa.select(av.c.seq).where(av.c.hash == h)).first():
                return h
            if asset.parent is not None and not s.execute(
                    sa.select(av.c.seq).where(av.c.hash == asset.parent)).first():
                raise NotFound(f"{asset.kind} {asset.name!r}: parent {asset.parent[:12]} is not "
                               "in the store; put the parent version first")
            s.execute(sa.insert(av), [{"hash": h, "kind": asset.kind, "name": asset.name,
                                       "parent_hash": asset.parent, "content": asset.content(),
                                       "created_at": T.utcnow()}])
            if members:
                s.execute(sa.insert(T.SkillLibraryMember.__table__),
                          [{"library_hash": h, "skill_hash": m, "position": i}
                           for i, m in enumerate(members)])
            return h

    def _library_members(self, asset: Asset) -> list[str]:
        """Member skill hashes of a library: any asset with a `skills` list (SkillLibrary).
        Items may be references with a `.hash` (coevo.assets.skill.SkillRef) or hash strings,
        whose versions must already be stored, or Asset objects, which are stored here."""
        skills = getattr(asset, "skills", None)
        if not isinstance(skills, (list, tuple)) or not skills:
            return []
        out: list[str] = []
        for i, item in enumerate(skills):
            if isinstance(item, Asset):
                out.append(self.put_asset(item))
                continue
            h = item if isinstance(item, str) else getattr(item, "hash", None)
            if not isinstance(h, str):
                raise CoevoError(f"{asset.kind} {asset.name!r}: skills.{i}: expected a skill, "
                                 f"a reference with .hash or a hash, got {type(item).__name__}")
            av = T.AssetVersion.__table__
            with self.transaction() as s:
                if not s.execute(sa.select(av.c.seq).where(av.c.hash == h)).first():
                    raise NotFound(f"{asset.kind} {asset.name!r}: skills.{i} ({h[:12]}) is not "
                                   "in the store; put the member skills first")
            out.append(h)
        return list(dict.fromkeys(out))  # a skill listed twice is one member

    def resolve(self, kind: str | None, ref: str) -> AssetRecord:
        """Find one version by full hash, name (the latest version with that name) or unique
        hash prefix. Raises NotFound, or Ambiguous listing the candidates."""
        av = T.AssetVersion.__table__
        base = sa.select(av.c.hash, av.c.kind, av.c.name, av.c.parent_hash, av.c.created_at)
        if kind is not None:
            base = base.where(av.c.kind == kind)
        what = kind or "asset"
        with self.transaction() as s:
            row = s.execute(base.where(av.c.hash == ref)).first()
            if row is None:
                # A name means the latest version a person or the gate stood behind: a
                # candidate that was never accepted (rejected, pending, invalid) shares its
                # parent's name but must not become what a new run starts from.
                pt = T.Proposal.__table__
                unaccepted = sa.select(pt.c.candidate_hash).where(
                    pt.c.candidate_hash.is_not(None), pt.c.status != "accepted")
                accepted = sa.select(pt.c.candidate_hash).where(pt.c.status == "accepted")
                named = base.where(av.c.name == ref).order_by(av.c.seq.desc())
                row = s.execute(named.where(sa.or_(av.c.hash.not_in(unaccepted),
                                                   av.c.hash.in_(accepted)))).first()
                if row is None:  # only candidates carry this name: the latest of them
                    row = s.execute(named).first()
            is_hex = bool(ref) and all(c in "0123456789abcdef" for c in ref)
            if row is None and is_hex and len(ref) >= _MIN_PREFIX:
                rows = s.execute(base.where(av.c.hash.startswith(ref, autoescape=True))
                                 .order_by(av.c.seq).limit(11)).all()
                if len(rows) > 1:
                    raise Ambiguous(ref, [f"{r.hash[:12]} ({r.kind} {r.name})" for r in rows])
                row = rows[0] if rows else None
        if row is None:
            short = is_hex and len(ref) < _MIN_PREFIX
            hint = f" (hash prefixes need {_MIN_PREFIX}+ hex digits)" if short else ""
            raise NotFound(f"no {what} version matches {ref!r}{hint}")
        return asset_record(row)

    def get_asset(self, kind: str | None, ref: str) -> Asset:
        """The stored version `ref` (see `resolve`) rebuilt as its asset class."""
        rec = self.resolve(kind, ref)
        av = T.AssetVersion.__table__
        with self.transaction() as s:
            content = s.execute(sa.select(av.c.content).where(av.c.hash == rec.hash)).scalar_one()
        return _asset_class(rec.kind).model_validate({**content, "parent": rec.parent})

    def list_assets(self, kind: str | None = None, name: str | None = None) -> list[AssetRecord]:
        """Stored versions, oldest first, optionally of one kind and name."""
        av = T.AssetVersion.__table__
        q = sa.select(av).order_by(av.c.seq)
        if kind is not None:
            q = q.where(av.c.kind == kind)
        if name is not None:
            q = q.where(av.c.name == name)
        with self.transaction() as s:
            return [asset_record(r) for r in s.execute(q)]

    def library_members(self, library: str, kind: str | None = "skill_library") -> list[str]:
        """Member skill hashes of a stored skill library, in library order."""
        m = T.SkillLibraryMember.__table__
        h = self.resolve(kind, library).hash
        with self.transaction() as s:
            return list(s.execute(sa.select(m.c.skill_hash).where(m.c.library_hash == h)
                                  .order_by(m.c.position)).scalars())

    def get_library(self, ref: str) -> tuple[Asset, list[Asset]]:
        """A stored skill library and its member skill versions (what an agent runs with)."""
        lib = self.get_asset("skill_library", ref)
        return lib, [self.get_asset("skill", h) for h in self.library_members(lib.hash)]

    def _lineage(self, ref: str, kind: str | None, up: bool) -> list[AssetRecord]:
        av = T.AssetVersion.__table__
        start = self.resolve(kind, ref).hash
        tree = (sa.select(av.c.hash, av.c.parent_hash, sa.literal(0).label("depth"))
                .where(av.c.hash == start).cte("lineage", recursive=True))
        step = av.c.hash == tree.c.parent_hash if up else av.c.parent_hash == tree.c.hash
        tree = tree.union_all(
            sa.select(av.c.hash, av.c.parent_hash, (tree.c.depth + 1).label("depth")).join(tree, step))
        q = (sa.select(av.c.hash, av.c.kind, av.c.name, av.c.parent_hash, av.c.created_at,
                       tree.c.depth).join(tree, tree.c.hash == av.c.hash)
             .where(tree.c.depth > 0).order_by(tree.c.depth, av.c.seq))
        with self.transaction() as s:
            return [asset_record(r, r.depth) for r in s.execute(q)]

    def ancestors(self, ref: str, kind: str | None = None) -> list[AssetRecord]:
        """Parent, grandparent, ... of a version (nearest first), one recursive query."""
        return self._lineage(ref, kind, up=True)

    def descendants(self, ref: str, kind: str | None = None) -> list[AssetRecord]:
        """Every version derived from `ref`, by depth then insertion order."""
        return self._lineage(ref, kind, up=False)

    # --- runs and rounds ---------------------------------------------------------------------

    def create_run(self, name: str, config: dict[str, Any] | None = None, mode: str = "gated",
                   status: str = "created", id: str | None = None) -> RunRecord:
        """Register a run. Names are unique (a resume finds the run by name)."""
        with self.transaction() as s:
            if s.execute(sa.select(T.Run.id).where(T.Run.name == name)).first():
                raise CoevoError(f"a run named {name!r} already exists")
            row = T.Run(id=id or _new_id(), name=name, config=config or {}, mode=mode,
                        status=status)
            s.add(row)
            s.flush()
            return run_record(row)

    def _run(self, s: Session, ref: str) -> T.Run:
        row = s.get(T.Run, ref) or s.execute(sa.select(T.Run).where(T.Run.name == ref)).scalar()
        if row is None:
            raise NotFound(f"no run with id or name {ref!r}")
        return row

    def get_run(self, ref: str) -> RunRecord:
        """A run by id or name."""
        with self.transaction() as s:
            return run_record(self._run(s, ref))

    def set_run_status(self, ref: str, status: str) -> RunRecord:
        with self.transaction() as s:
            row = self._run(s, ref)
            row.status = status
            s.flush()
            return run_record(row)

    def runs(self) -> list[RunRecord]:
        """All runs, oldest first."""
        with self.transaction() as s:
            rows = s.execute(sa.select(T.Run).order_by(T.Run.created_at, T.Run.id)).scalars()
            return [run_record(r) for r in rows]

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

    def start_round(self, run: str, index: int | None = None) -> RoundRecord:
        """Open a round (status "running"); `index` defaults to one past the last round."""
        with self.transaction() as s:
            run_id = self._run(s, run).id
            if index is None:
                last = s.execute(sa.select(sa.func.max(T.Round.index))
                                 .where(T.Round.run_id == run_id)).scalar()
                index = 0 if last is None else last + 1
            elif s.execute(sa.select(T.Round.id).where(T.Round.run_id == run_id,
                                                       T.Round.index == index)).first():
                raise CoevoError(f"run {run_id} already has a round {index}")
            row = T.Round(run_id=run_id, index=index, status="running", summary={})
            s.add(row)
            s.flush()
            return round_record(row)

    def finish_round(self, run: str, index: int, status: str = "done",
                     summary: dict[str, Any] | None = None) -> RoundRecord:
        """Close a round with its status and summary (the end time is set now)."""
        with self.transaction() as s:
            row = self._round(s, self._run(s, run).id, index)
            row.status, row.ended_at = status, T.utcnow()
            if summary is not None:
                row.summary = summary
            s.flush()
            return round_record(row)

    def get_round(self, run: str, index: int) -> RoundRecord:
        with self.transaction() as s:
            return round_record(self._round(s, self._run(s, run).id, index))

    def rounds(self, run: str) -> list[RoundRecord]:
        with self.transaction() as s:
            run_id = self._run(s, run).id
            rows = s.execute(sa.select(T.Round).where(T.Round.run_id == run_id)
                             .order_by(T.Round.index)).scalars()
            return [round_record(r) for r in rows]

    # --- checkpoints -------------------------------------------------------------------------

    def add_checkpoint(self, *, path: str, sha256: str, base_model: str, step: int,
                       run: str | None = None, round: int | None = None,
                       parent: str | None = None, harness: str | None = None,
                       skill_library: str | None = None, rubric: str | None = None,
                       id: str | None = None) -> CheckpointRecord:
        """Record a saved adapter and the assets it was trained with (hashes must be stored)."""
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            refs = self._check_assets(s, "checkpoint", dict(
                harness=harness, skill_library=skill_library, rubric=rubric))
            if parent is not None and s.get(T.Checkpoint, parent) is None:
                raise NotFound(f"checkpoint: parent {parent!r} is not in the store")
            row = T.Checkpoint(id=id or _new_id(), run_id=run_id, round=round, path=str(path),
                               sha256=sha256, base_model=base_model, step=step, parent_id=parent,
                               harness_hash=refs["harness"], rubric_hash=refs["rubric"],
                               skill_library_hash=refs["skill_library"])
            s.add(row)
            s.flush()
            return checkpoint_record(row)

    def get_checkpoint(self, ref: str) -> CheckpointRecord:
        """A checkpoint by id, or by its file's sha256 (the earliest record of that file)."""
        with self.transaction() as s:
            row = s.get(T.Checkpoint, ref) or s.execute(
                sa.select(T.Checkpoint).where(T.Checkpoint.sha256 == ref)
                .order_by(T.Checkpoint.created_at)).scalar()
            if row is None:
                raise NotFound(f"no checkpoint with id or sha256 {ref!r}")
            return checkpoint_record(row)

    def latest_checkpoint(self, run: str | None = None) -> CheckpointRecord | None:
        """The highest-step checkpoint of `run` (of any run when None); None if there is none."""
        with self.transaction() as s:
            q = sa.select(T.Checkpoint).order_by(T.Checkpoint.step.desc(),
                                                 T.Checkpoint.created_at.desc())
            if run is not None:
                q = q.where(T.Checkpoint.run_id == self._run(s, run).id)
            row = s.execute(q.limit(1)).scalar()
            return checkpoint_record(row) if row else None

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

    # --- trajectories ------------------------------------------------------------------------

    def add_trajectories(self, trajs: Sequence[Trajectory], run: str | None = None,
                         round: int | None = None, evaluation: str | None = None) -> list[str]:
        """Store a batch of trajectories in one transaction (one executemany); returns ids.
        The asset versions and checkpoints they name must already be stored."""
        if not trajs:
            return []
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            if evaluation is not None and s.get(T.Evaluation, evaluation) is None:
                raise NotFound(f"no evaluation {evaluation!r}")
            refs: dict[str, str] = {}  # one label per distinct hash: a readable error, one query
            seen: set[str] = set()
            for t in trajs:
                for key in _ASSET_REFS:
                    h = getattr(t, key)
                    if h and h not in seen:
                        seen.add(h)
                        refs[f"trajectory {t.id}: {key}"] = h
            self._check_assets(s, "add_trajectories", refs)
            ckpts = {t.checkpoint for t in trajs if t.checkpoint}
            if ckpts:
                have = set(s.execute(sa.select(T.Checkpoint.id)
                                     .where(T.Checkpoint.id.in_(ckpts))).scalars())
                if ckpts - have:
                    raise NotFound(f"add_trajectories: checkpoint {sorted(ckpts - have)[0]!r} "
                                   "is not in the store")
            now = T.utcnow()
            rows = [trajectory_row(t, run_id, round, evaluation, now) for t in trajs]
            s.execute(sa.insert(T.Trajectory.__table__), rows)
            return [r["id"] for r in rows]

    def trajectories(self, run: str | None = None, round: int | None = None,
                     harness: str | None = None, split: str | None = None,
                     evaluation: str | None = None, ids: Iterable[str] | None = None,
                     limit: int | None = None) -> list[Trajectory]:
        """Stored trajectories matching every given filter, in insertion order, decoded
        (token ids, mask and logprobs exactly as stored). `harness` is a full hash."""
        tt = T.Trajectory.__table__
        q = sa.select(tt).order_by(tt.c.seq)
        with self.transaction() as s:
            if run is not None:
                q = q.where(tt.c.run_id == self._run(s, run).id)
            for col, value in ((tt.c.round, round), (tt.c.harness_hash, harness),
                               (tt.c.split, split), (tt.c.evaluation_id, evaluation)):
                if value is not None:
                    q = q.where(col == value)
            if ids is not None:
                q = q.where(tt.c.id.in_(list(ids)))
            if limit is not None:
                q = q.limit(limit)
            return [trajectory_from_row(r) for r in s.execute(q)]

    # --- evaluations -------------------------------------------------------------------------

    def create_evaluation(self, *, split: str, env: str, run: str | None = None,
                          round: int | None = None, harness: str | None = None,
                          skill_library: str | None = None, rubric: str | None = None,
                          checkpoint: str | None = None, summary: dict[str, Any] | None = None,
                          id: str | None = None) -> str:
        """Open an evaluation of fixed (assets, checkpoint) on a split; returns its id."""
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            self._check_assets(s, "evaluation", dict(harness=harness, rubric=rubric,
                                                     skill_library=skill_library), checkpoint)
            row = T.Evaluation(id=id or _new_id(), run_id=run_id, round=round, split=split,
                               env=env, harness_hash=harness, skill_library_hash=skill_library,
                               rubric_hash=rubric, checkpoint_id=checkpoint, n=0,
                               summary=summary or {})
            s.add(row)
            s.flush()
            return row.id

    def add_results(self, evaluation: str, results: Sequence[ResultRow | dict[str, Any]],
                    summary: dict[str, Any] | None = None) -> int:
        """Append per-task results (and optionally the final summary); returns the new n."""
        rows = [ResultRow.model_validate(r) for r in results]
        with self.transaction() as s:
            ev = s.get(T.Evaluation, evaluation)
            if ev is None:
                raise NotFound(f"no evaluation {evaluation!r}")
            if rows:
                s.execute(sa.insert(T.EvaluationResult.__table__), [
                    {"evaluation_id": ev.id, "task_id": r.task_id, "sample": r.sample,
                     "outcome": r.outcome, "success": r.success, "reward": r.reward,
                     "criteria": r.criteria, "status": r.status, "trajectory_id": r.trajectory}
                    for r in rows])
            ev.n += len(rows)
            if summary is not None:
                ev.summary = summary
            s.flush()
            return ev.n

    def get_evaluation(self, id: str) -> EvaluationRecord:
        """An evaluation with its results, ordered by task and sample."""
        with self.transaction() as s:
            ev = s.get(T.Evaluation, id)
            if ev is None:
                raise NotFound(f"no evaluation {id!r}")
            er = T.EvaluationResult
            results = s.execute(sa.select(er).where(er.evaluation_id == id)
                                .order_by(er.task_id, er.sample)).scalars()
            return EvaluationRecord(
                id=ev.id, run=ev.run_id, round=ev.round, split=ev.split, env=ev.env,
                harness=ev.harness_hash, skill_library=ev.skill_library_hash,
                rubric=ev.rubric_hash, checkpoint=ev.checkpoint_id, n=ev.n, summary=ev.summary,
                created_at=ev.created_at, results=[ResultRow(
                    task_id=r.task_id, sample=r.sample, outcome=r.outcome, success=r.success,
                    reward=r.reward, criteria=r.criteria, status=r.status,
                    trajectory=r.trajectory_id) for r in results])

    # --- proposals, decisions, evidence ------------------------------------------------------

    def add_proposal(self, *, proposer: str, kind: str, parent: str | None,
                     candidate: Asset | str | None, run: str | None = None,
                     round: int | None = None, status: str = "pending", rationale: str = "",
                     predicted_effect: str = "", prompt: str = "", raw_output: str = "",
                     error: str | None = None, diff: dict[str, Any] | None = None,
                     model: str = "") -> str:
        """Record a proposal; a candidate Asset is stored first (same transaction). An invalid
        proposal (status "invalid", `error` set) may have no candidate. Returns its id."""
        _check_status(status)
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            cand = self.put_asset(candidate) if isinstance(candidate, Asset) else candidate
            self._check_assets(s, "proposal", {"parent": parent, "candidate": cand})
            row = T.Proposal(id=_new_id(), run_id=run_id, round=round, proposer=proposer,
                             kind=kind, parent_hash=parent, candidate_hash=cand, status=status,
                             rationale=rationale, predicted_effect=predicted_effect,
                             prompt=prompt, raw_output=raw_output, error=error, diff=diff or {},
                             model=model)
            s.add(row)
            s.flush()
            return row.id

    def _proposal(self, s: Session, id: str) -> T.Proposal:
        row = s.execute(sa.select(T.Proposal).where(T.Proposal.id == id)).scalar()
        if row is None:
            raise NotFound(f"no proposal {id!r}")
        return row

    def set_proposal_status(self, id: str, status: str, error: str | None = None) -> None:
        _check_status(status)
        with self.transaction() as s:
            row = self._proposal(s, id)
            row.status = status
            if error is not None:
                row.error = error

    def get_proposal(self, id: str) -> ProposalRecord:
        with self.transaction() as s:
            return proposal_record(self._proposal(s, id))

    def proposals(self, run: str | None = None, status: str | None = None,
                  round: int | None = None) -> list[ProposalRecord]:
        """Proposals matching every given filter, in the order they were made."""
        p = T.Proposal
        q = sa.select(p).order_by(p.seq)
        with self.transaction() as s:
            if run is not None:
                q = q.where(p.run_id == self._run(s, run).id)
            if status is not None:
                _check_status(status)
                q = q.where(p.status == status)
            if round is not None:
                q = q.where(p.round == round)
            return [proposal_record(r) for r in s.execute(q).scalars()]

    def add_decision(self, proposal: str, *, policy: str, accepted: bool, reason: str,
                     statistic: dict[str, Any] | None = None, rollouts: int = 0,
                     evidence: Sequence[EvidenceRow | dict[str, Any]] = ()) -> str:
        """Record a gate decision with its per-task evidence, and set the proposal's status to
        accepted / rejected in the same transaction. Returns the decision id."""
        ev_rows = [EvidenceRow.model_validate(e) for e in evidence]
        with self.transaction() as s:
            prop = self._proposal(s, proposal)
            row = T.Decision(id=_new_id(), proposal_id=prop.id, policy=policy,
                             accepted=accepted, reason=reason, statistic=statistic or {},
                             rollouts=rollouts)
            s.add(row)
            s.flush()
            if ev_rows:
                s.execute(sa.insert(T.Evidence.__table__), [
                    {"decision_id": row.id, "proposal_id": prop.id, **e.model_dump()}
                    for e in ev_rows])
            prop.status = "accepted" if accepted else "rejected"
            return row.id

    def decisions(self, proposal: str) -> list[DecisionRecord]:
        """A proposal's decisions (oldest first), each with its evidence rows."""
        d, e = T.Decision, T.Evidence
        with self.transaction() as s:
            prop = self._proposal(s, proposal)
            out = []
            for r in s.execute(sa.select(d).where(d.proposal_id == prop.id)
                               .order_by(d.created_at, d.id)).scalars():
                rows = s.execute(sa.select(e).where(e.decision_id == r.id).order_by(e.id)).scalars()
                out.append(DecisionRecord(
                    id=r.id, proposal=r.proposal_id, policy=r.policy, accepted=r.accepted,
                    reason=r.reason, statistic=r.statistic, rollouts=r.rollouts,
                    created_at=r.created_at, evidence=[EvidenceRow(
                        task_id=x.task_id, sample=x.sample, incumbent=x.incumbent,
                        candidate=x.candidate, status=x.status) for x in rows]))
            return out

    # --- budgets -----------------------------------------------------------------------------

    def add_budget(self, run: str, kind: str, amount: float, round: int | None = None) -> None:
        """Charge `amount` of `kind` (rollouts, tokens, proposer_calls, seconds ...) to a run."""
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            s.execute(sa.insert(T.Budget.__table__), [{"run_id": run_id, "round": round,
                                                       "kind": kind, "amount": float(amount),
                                                       "created_at": T.utcnow()}])

    def budget_totals(self, run: str, round: int | None = None) -> dict[str, float]:
        """Total spent per kind for a run (or one of its rounds)."""
        b = T.Budget
        with self.transaction() as s:
            q = (sa.select(b.kind, sa.func.sum(b.amount)).where(b.run_id == self._run(s, run).id)
                 .group_by(b.kind).order_by(b.kind))
            if round is not None:
                q = q.where(b.round == round)
            return {k: float(v) for k, v in s.execute(q)}


def _check_status(status: str) -> None:
    if status not in PROPOSAL_STATUSES:
        raise CoevoError(f"proposal status {status!r}; expected one of {', '.join(PROPOSAL_STATUSES)}")
