"""The loop's review step (gate.human_review): at the start of a round, the candidates the gate
accepted and a person has since approved join the incumbent; vetoed ones are rejected.

Each applied review is a decision row next to the gate's (policy "review"), citing the review,
and sets the proposal's status. Order and conflicts: the held candidates are taken in the
order they were proposed; an approved candidate whose parent is no longer the incumbent's
version of its kind (an earlier approved candidate of that kind was applied first) is
rejected, never merged. A candidate without a review keeps waiting; one approved after the
last round started is never applied (the run is over).

Resume. The round's review decisions and the list of what they applied are written in one
transaction, the list into the round's summary (`reviews`); a resumed round finds the list and
replays it onto the incumbent it restored from the previous round, deciding nothing again, so
a review is applied exactly once.
"""

from __future__ import annotations

from typing import Any

from coevo.propose.base import Candidate, Incumbent, stored_candidate
from coevo.store.records import REVIEW_POLICY


def review_step(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    """The round-start incumbent with the approved candidates applied, and those candidates."""
    if not run.cfg.gate.human_review:
        return incumbent, []
    store = run.store
    summary = store.get_round(run.id, r).summary
    if "reviews" in summary:  # decided before a crash: replay
        approved = [stored_candidate(store, store.get_proposal(pid))
                    for pid in summary["reviews"]["approved"]]
    else:
        approved = apply_reviews(run, r, incumbent, summary)
    for cand in approved:
        incumbent = incumbent.with_candidate(cand)
    return incumbent, approved


def apply_reviews(run: Any, r: int, incumbent: Incumbent,
                  summary: dict[str, Any]) -> list[Candidate]:
    """Decide every reviewed held candidate (one transaction with the round's summary)."""
    store = run.store
    reviews = {rv.proposal: rv for rv in store.reviews(run=run.id)}
    approved: list[Candidate] = []
    done: dict[str, list[str]] = {"approved": [], "rejected": []}
    with store.transaction():
        for p in store.awaiting_review(run.id):
            rv = reviews.get(p.id)
            if rv is None:
                continue  # keeps waiting
            cite = f"review {rv.id[:12]} by {rv.by}" + (f": {rv.note}" if rv.note else "")
            current = incumbent.asset(p.kind)
            if rv.decision == "veto":
                ok, reason = False, f"vetoed by {cite}"
            elif (current.hash if current is not None else None) != p.parent:
                ok, reason = False, (f"approved by {cite}; not applied: the incumbent's {p.kind} "
                                     "changed since the gate compared it")
            else:
                ok, reason = True, f"approved by {cite}; applied at the start of round {r}"
            store.add_decision(p.id, policy=REVIEW_POLICY, accepted=ok, reason=reason,
                               statistic={"review": rv.id, "by": rv.by, "round": r})
            done["approved" if ok else "rejected"].append(p.id)
            if ok:
                cand = stored_candidate(store, p)
                approved.append(cand)
                incumbent = incumbent.with_candidate(cand)
        store.finish_round(run.id, r, "running", summary={**summary, "reviews": done})
    if done["approved"] or done["rejected"]:
        run.progress(f"round {r}: reviews applied: {len(done['approved'])} approved, "
                     f"{len(done['rejected'])} rejected")
    return approved
