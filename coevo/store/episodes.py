"""Trajectories and evaluations (per-task results) in the store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from coevo.errors import CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.base import StoreBase, new_id
from coevo.store.records import (
    EvaluationRecord,
    ResultRow,
    trajectory_from_row,
    trajectory_row,
)
from coevo.trajectory import Trajectory

_ASSET_REFS = ("harness", "skill_library", "rubric")


class EpisodeStore(StoreBase):
    # --- trajectories ------------------------------------------------------------------------

    def add_trajectories(self, trajs: Sequence[Trajectory], run: str | None = None,
                         round: int | None = None, evaluation: str | None = None) -> list[str]:
        """Store a batch of trajectories in one transaction (one executemany); returns ids.
        The asset versions and checkpoints they name must already be stored."""
        if not trajs:
            return []
        imported = [t for t in trajs if t.split == "imported"]  # coevo.traces.IMPORTED
        if imported and (run is not None or evaluation is not None or any(t.trainable for t in imported)):
            raise CoevoError(f"trajectory {imported[0].id}: an imported trace belongs to no run "
                             "or evaluation and is never trainable")
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
                     limit: int | None = None, env: str | None = None,
                     checkpoint: str | None = None) -> list[Trajectory]:
        """Stored trajectories matching every given filter, in insertion order, decoded
        (token ids, mask and logprobs exactly as stored). `harness` is a full hash;
        `checkpoint` a checkpoint id, or "" for those recorded without one (the base model)."""
        tt = T.Trajectory.__table__
        q = sa.select(tt).order_by(tt.c.seq)
        with self.transaction() as s:
            if run is not None:
                q = q.where(tt.c.run_id == self._run(s, run).id)
            for col, value in ((tt.c.round, round), (tt.c.harness_hash, harness),
                               (tt.c.split, split), (tt.c.evaluation_id, evaluation),
                               (tt.c.env, env)):
                if value is not None:
                    q = q.where(col == value)
            if checkpoint is not None:
                q = q.where(tt.c.checkpoint_id == checkpoint if checkpoint
                            else tt.c.checkpoint_id.is_(None))
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
                          id: str | None = None, key: str | None = None) -> str:
        """Open an evaluation of fixed (assets, checkpoint) on a split; returns its id. `key`:
        an idempotency key, unique in the store (`find_evaluation`)."""
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            self._check_assets(s, "evaluation", dict(harness=harness, rubric=rubric,
                                                     skill_library=skill_library), checkpoint)
            row = T.Evaluation(id=id or new_id(), run_id=run_id, round=round, split=split,
                               env=env, harness_hash=harness, skill_library_hash=skill_library,
                               rubric_hash=rubric, checkpoint_id=checkpoint, n=0,
                               summary=summary or {}, key=key)
            s.add(row)
            s.flush()
            return row.id

    def find_evaluation(self, key: str) -> str | None:
        """The id of the evaluation stored under idempotency `key` (None: none yet)."""
        with self.transaction() as s:
            return s.execute(sa.select(T.Evaluation.id).where(T.Evaluation.key == key)).scalar()

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
                    trajectory=r.trajectory_id) for r in results], key=ev.key)

    def evaluation_ids(self, run: str, split: str | None = None) -> list[str]:
        """The ids of a run's evaluations (on `split` when given), oldest first."""
        with self.transaction() as s:
            run_id = self._run(s, run).id
            q = sa.select(T.Evaluation.id).where(T.Evaluation.run_id == run_id)
            if split is not None:
                q = q.where(T.Evaluation.split == split)
            return list(s.execute(q.order_by(T.Evaluation.created_at, T.Evaluation.id)).scalars())
