"""Human reviews in the store: a person approves or vetoes a candidate that the gate passed
and the run holds for review (`gate.human_review`, coevo/reviewstep.py applies them).

A candidate awaits review when its proposal is still `pending` although the gate's decision
accepted it: that state is derived from the rows, never kept apart, so a resumed run sees
exactly what the store holds. One review per proposal (a unique key): the first word stands,
a second is refused with the first one's author and verdict.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from coevo.errors import CoevoError
from coevo.store import tables as T
from coevo.store.base import StoreBase, new_id
from coevo.store.records import (
    REVIEW_DECISIONS,
    REVIEW_POLICY,
    ProposalRecord,
    ReviewRecord,
    proposal_record,
)


class ReviewStore(StoreBase):
    _proposal: Any  # ProposalStore._proposal (the parts are composed into Store)

    def add_review(self, proposal: str, *, decision: str, by: str, note: str = "") -> str:
        """Record `by`'s approve / veto of a candidate awaiting review; returns the review id.
        Refused (CoevoError, one line) for an unknown proposal, a bad decision or name, a
        proposal that does not await review, or one already reviewed."""
        if decision not in REVIEW_DECISIONS:
            raise CoevoError(f"review decision {decision!r}: expected approve or veto")
        if not by.strip():
            raise CoevoError("a review needs the reviewer's name (--by NAME)")
        with self.transaction() as s:
            prop = self._proposal(s, proposal)
            done = s.execute(sa.select(T.Review).where(T.Review.proposal_id == prop.id)).scalar()
            if done is not None:
                raise CoevoError(f"proposal {prop.id[:12]} was already reviewed: {done.decision} "
                                 f"by {done.reviewer} (review {done.id[:12]})")
            if prop.status != "pending":
                raise CoevoError(f"proposal {prop.id[:12]} is {prop.status}, not pending review")
            if not self._gate_accepted(s, prop.id):
                raise CoevoError(f"proposal {prop.id[:12]} does not await review: the gate has "
                                 "not accepted it (only a candidate the gate passed in a run "
                                 "with gate.human_review can be reviewed)")
            row = T.Review(id=new_id(), proposal_id=prop.id, reviewer=by.strip(),
                           decision=decision, note=note)
            s.add(row)
            s.flush()
            return row.id

    def _gate_accepted(self, s: Session, proposal_id: str) -> bool:
        d = T.Decision
        return s.execute(sa.select(d.id).where(d.proposal_id == proposal_id, d.accepted.is_(True),
                                               d.policy != REVIEW_POLICY).limit(1)).first() is not None

    def reviews(self, proposal: str | None = None, run: str | None = None) -> list[ReviewRecord]:
        """Reviews (oldest first) of one proposal, or of every proposal of a run, or all."""
        rv, p = T.Review, T.Proposal
        q = sa.select(rv).join(p, p.id == rv.proposal_id).order_by(rv.created_at, rv.id)
        with self.transaction() as s:
            if proposal is not None:
                q = q.where(rv.proposal_id == self._proposal(s, proposal).id)
            if run is not None:
                q = q.where(p.run_id == self._run(s, run).id)
            return [ReviewRecord(id=r.id, proposal=r.proposal_id, by=r.reviewer,
                                 decision=r.decision, note=r.note or "", created_at=r.created_at)
                    for r in s.execute(q).scalars()]

    def awaiting_review(self, run: str) -> list[ProposalRecord]:
        """The run's candidates held for review (pending, with an accepted gate decision), in
        the order they were proposed."""
        p, d = T.Proposal, T.Decision
        with self.transaction() as s:
            run_id = self._run(s, run).id
            q = (sa.select(p).where(p.run_id == run_id, p.status == "pending", sa.exists().where(
                d.proposal_id == p.id, d.accepted.is_(True), d.policy != REVIEW_POLICY))
                 .order_by(p.seq))
            return [proposal_record(r) for r in s.execute(q).scalars()]
