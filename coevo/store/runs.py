"""Runs, rounds, checkpoints and the budget ledger in the store."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from coevo.errors import Ambiguous, CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.base import MIN_PREFIX, StoreBase, is_hex, new_id
from coevo.store.records import (
    CheckpointRecord,
    RoundRecord,
    RunRecord,
    checkpoint_record,
    round_record,
    run_record,
)


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot name a run (None: it can). A run name appears in paths (checkpoint
    folders) and on one line of output, so it has no path separators, is not `.` or `..`, and
    has no control characters.

    >>> run_name_problem("quickstart-1"), run_name_problem("../x")
    (None, 'may not contain a path separator (/ or \\\\)')
    """
    if not name or len(name) > 200:
        return "must be 1 to 200 characters"
    if "/" in name or "\\" in name:
        return "may not contain a path separator (/ or \\)"
    if name in (".", ".."):
        return "may not be '.' or '..'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "may not contain control characters (newlines, tabs, escapes)"
    return None


class RunStore(StoreBase):
    # --- runs and rounds ---------------------------------------------------------------------

    def create_run(self, name: str, config: dict[str, Any] | None = None, mode: str = "gated",
                   status: str = "created", id: str | None = None) -> RunRecord:
        """Register a run. Names are unique (a resume finds the run by name) and follow
        `run_name_problem`'s rule."""
        problem = run_name_problem(name)
        if problem:
            raise CoevoError(f"run name {name!r}: {problem}")
        with self.transaction() as s:
            if s.execute(sa.select(T.Run.id).where(T.Run.name == name)).first():
                raise CoevoError(f"a run named {name!r} already exists")
            row = T.Run(id=id or new_id(), name=name, config=config or {}, mode=mode,
                        status=status)
            s.add(row)
            s.flush()
            return run_record(row)

    def get_run(self, ref: str) -> RunRecord:
        """A run by id or name."""
        with self.transaction() as s:
            return run_record(self._run(s, ref))

    def set_run_status(self, ref: str, status: str, error: str | None = None) -> RunRecord:
        """Set a run's status; `error` says why a `failed` run failed (any other status
        clears it: a resumed run is no longer failing)."""
        with self.transaction() as s:
            row = self._run(s, ref)
            row.status, row.error = status, error
            s.flush()
            return run_record(row)

    def set_trackers(self, ref: str, links: list[dict[str, Any]]) -> RunRecord:
        """Record a run's links to its experiment-tracker runs (coevo/tracking) under its
        config's `trackers` key, replacing the previous list: the one key of a run's config
        written after the run is created (the rest is what the run was started with)."""
        with self.transaction() as s:
            row = self._run(s, ref)
            row.config = {**row.config, "trackers": links}
            s.flush()
            return run_record(row)

    def runs(self) -> list[RunRecord]:
        """All runs, oldest first."""
        with self.transaction() as s:
            rows = s.execute(sa.select(T.Run).order_by(T.Run.created_at, T.Run.id)).scalars()
            return [run_record(r) for r in rows]

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
            row = T.Checkpoint(id=id or new_id(), run_id=run_id, round=round, path=str(path),
                               sha256=sha256, base_model=base_model, step=step, parent_id=parent,
                               harness_hash=refs["harness"], rubric_hash=refs["rubric"],
                               skill_library_hash=refs["skill_library"])
            s.add(row)
            s.flush()
            return checkpoint_record(row)

    def get_checkpoint(self, ref: str) -> CheckpointRecord:
        """A checkpoint by id, or by its file's sha256 (the earliest record of that file), or by
        a unique prefix of either, as `coevo runs show` prints them (12 hex digits). Raises
        NotFound, or Ambiguous listing the candidates."""
        ck = T.Checkpoint
        with self.transaction() as s:
            row = s.get(ck, ref) or s.execute(
                sa.select(ck).where(ck.sha256 == ref).order_by(ck.created_at)).scalar()
            hexref = is_hex(ref)
            if row is None and hexref and len(ref) >= MIN_PREFIX:
                rows = s.execute(sa.select(ck).where(sa.or_(
                    ck.id.startswith(ref, autoescape=True),
                    ck.sha256.startswith(ref, autoescape=True))).order_by(ck.created_at)).scalars()
                found, files = {}, set()
                for r in rows:  # oldest first: a file matched by its sha256 is its earliest record
                    if r.id.startswith(ref) or (r.sha256.startswith(ref) and r.sha256 not in files):
                        found[r.id] = r
                    files.add(r.sha256)
                if len(found) > 1:
                    raise Ambiguous(ref, [f"{r.id[:12]} (step {r.step})" for r in found.values()])
                row = next(iter(found.values()), None)
            if row is None:
                hint = (f" (prefixes need {MIN_PREFIX}+ hex digits)"
                        if hexref and len(ref) < MIN_PREFIX else "")
                raise NotFound(f"no checkpoint with id or sha256 {ref!r}{hint}")
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

    # --- budgets -----------------------------------------------------------------------------

    def add_budget(self, run: str, kind: str, amount: float, round: int | None = None,
                   key: str | None = None) -> None:
        """Charge `amount` of `kind` (rollouts, tokens, proposer_calls, seconds ...) to a run.
        With a `key` the charge is idempotent: a second charge of the same (run, kind, key)
        is ignored (the first one stands), so work redone after a crash is charged once."""
        self.charge(run, {kind: amount}, round=round, key=key)

    def charge(self, run: str, amounts: dict[str, float], round: int | None = None,
               key: str | None = None) -> None:
        """Several kinds of one charge in one transaction (see `add_budget` for `key`)."""
        b = T.Budget.__table__
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            if key is not None:
                have = set(s.execute(sa.select(b.c.kind).where(
                    b.c.run_id == run_id, b.c.key == key)).scalars())
                amounts = {k: v for k, v in amounts.items() if k not in have}
            if amounts:
                now = T.utcnow()
                s.execute(sa.insert(b), [{"run_id": run_id, "round": round, "kind": k,
                                          "amount": float(v), "key": key, "created_at": now}
                                         for k, v in amounts.items()])

    def budget_totals(self, run: str, round: int | None = None,
                      exclude_prefix: str | None = None) -> dict[str, float]:
        """Total spent per kind for a run (or one of its rounds); `exclude_prefix` leaves out
        the charges whose key starts with it (the gate replays its own, coevo/ledger.py)."""
        b = T.Budget
        with self.transaction() as s:
            q = (sa.select(b.kind, sa.func.sum(b.amount)).where(b.run_id == self._run(s, run).id)
                 .group_by(b.kind).order_by(b.kind))
            if round is not None:
                q = q.where(b.round == round)
            if exclude_prefix is not None:
                q = q.where(sa.or_(b.key.is_(None),
                                   sa.not_(b.key.startswith(exclude_prefix, autoescape=True))))
            return {k: float(v) for k, v in s.execute(q)}
