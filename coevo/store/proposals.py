"""Proposals, gate decisions and their per-task evidence in the store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from coevo.assets.base import Asset
from coevo.errors import CoevoError, NotFound
from coevo.store import tables as T
from coevo.store.base import StoreBase, new_id
from coevo.store.records import (
    PROPOSAL_STATUSES,
    DecisionRecord,
    EvidenceRow,
    ProposalRecord,
    proposal_record,
    with_edits,
)


class ProposalStore(StoreBase):
    # --- proposals, decisions, evidence ------------------------------------------------------

    def add_proposal(self, *, proposer: str, kind: str, parent: str | None,
                     candidate: Asset | str | None, run: str | None = None,
                     round: int | None = None, status: str = "pending", rationale: str = "",
                     predicted_effect: str = "", prompt: str = "", raw_output: str = "",
                     error: str | None = None, diff: dict[str, Any] | None = None,
                     model: str = "", edits: Sequence[dict[str, Any]] = ()) -> str:
        """Record a proposal; a candidate Asset is stored first (same transaction). An invalid
        proposal (status "invalid", `error` set) may have no candidate. `edits`: the typed
        edit operations that built it (kept in the diff column, see `records.EDITS_KEY`).
        Returns its id."""
        _check_status(status)
        with self.transaction() as s:
            run_id, round = self._run_round(s, run, round)
            cand = self.put_asset(candidate) if isinstance(candidate, Asset) else candidate
            self._check_assets(s, "proposal", {"parent": parent, "candidate": cand})
            row = T.Proposal(id=new_id(), run_id=run_id, round=round, proposer=proposer,
                             kind=kind, parent_hash=parent, candidate_hash=cand, status=status,
                             rationale=rationale, predicted_effect=predicted_effect,
                             prompt=prompt, raw_output=raw_output, error=error,
                             diff=with_edits(diff or {}, edits), model=model)
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
                     evidence: Sequence[EvidenceRow | dict[str, Any]] = (), metric: str = "",
                     stages: Sequence[Any] = (), status: str | None = None) -> str:
        """Record a gate decision with its per-task evidence, the metric it decided on and the
        stage records of its comparison (pydantic models or dicts), and set the proposal's
        status to accepted / rejected in the same transaction (`status` overrides it: a run
        with human review keeps an accepted candidate "pending" its review). One decision per
        proposal and policy (a unique key). Returns the decision id."""
        if status is not None:
            _check_status(status)
        ev_rows = [EvidenceRow.model_validate(e) for e in evidence]
        with self.transaction() as s:
            prop = self._proposal(s, proposal)
            row = T.Decision(id=new_id(), proposal_id=prop.id, policy=policy,
                             accepted=accepted, reason=reason, statistic=statistic or {},
                             rollouts=rollouts, metric=metric,
                             stages=[x.model_dump(mode="json") if hasattr(x, "model_dump")
                                     else dict(x) for x in stages])
            s.add(row)
            s.flush()
            if ev_rows:
                s.execute(sa.insert(T.Evidence.__table__), [
                    {"decision_id": row.id, "proposal_id": prop.id, **e.model_dump()}
                    for e in ev_rows])
            prop.status = status or ("accepted" if accepted else "rejected")
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
                    created_at=r.created_at, metric=r.metric or "", stages=r.stages or [],
                    evidence=[EvidenceRow(
                        task_id=x.task_id, sample=x.sample, incumbent=x.incumbent,
                        candidate=x.candidate, status=x.status,
                        incumbent_partial=x.incumbent_partial,
                        candidate_partial=x.candidate_partial) for x in rows]))
            return out


def _check_status(status: str) -> None:
    if status not in PROPOSAL_STATUSES:
        raise CoevoError(f"proposal status {status!r}; expected one of {', '.join(PROPOSAL_STATUSES)}")
