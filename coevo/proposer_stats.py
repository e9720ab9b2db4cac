"""Per-proposer figures over the stored proposals (`coevo proposals stats`): how often a
proposer's output is valid, how often the gate accepts what it proposes, and by how much.

For each proposer (the `proposer` name a proposal was stored with), over the proposals of one
run or of the whole store:

    proposals   every stored proposal
    invalid     status "invalid" (the output broke a schema, a whitelist or a validity check)
    valid rate  (proposals - invalid) / proposals
    gated       valid proposals the gate compared (a gate decision with a paired statistic,
                or a peer mode's val-mean comparison: fst, bettertogether, skillopt); a valid
                proposal rejected without a comparison ("not gated: budget", a peer mode that
                does not evaluate its kind) or still pending is counted in neither
    accepted    gated proposals the gate (or the peer mode's rule) accepted (a reviewer's later
                veto does not undo it: this measures the proposer and the gate, not the review)
    accept rate accepted / gated
    accepted delta  the mean of the gate's `mean_diff` (candidate - incumbent on the gate's
                metric, per paired task) over the accepted ones
    gated delta the same over every gated one (a proposer whose gated delta is negative
                proposes harm more often than help)

Read-only; the figures are recomputed from the proposals and decisions tables each time.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pydantic import BaseModel, ConfigDict
from rich.markup import escape
from rich.table import Table

from coevo.audit import fmt, proposal_rows
from coevo.terminal import safe


class ProposerStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    proposer: str
    proposals: int
    invalid: int
    gated: int
    accepted: int
    accepted_delta: float | None = None
    gated_delta: float | None = None

    @property
    def valid_rate(self) -> float | None:
        return (self.proposals - self.invalid) / self.proposals if self.proposals else None

    @property
    def accept_rate(self) -> float | None:
        return self.accepted / self.gated if self.gated else None

    def doc(self) -> dict[str, Any]:
        return {**self.model_dump(), "valid_rate": self.valid_rate,
                "accept_rate": self.accept_rate}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def proposer_stats(store: Any, run: str | None = None) -> list[ProposerStats]:
    """One row per proposer name, sorted by name."""
    by: dict[str, list[Any]] = defaultdict(list)
    for row in proposal_rows(store, run=run):
        by[row.proposer].append(row)
    out = []
    for name in sorted(by):
        rows = by[name]
        gated = [r for r in rows if r.status != "invalid" and r.mean_diff is not None]
        acc = [r for r in gated if r.gate_accepted]
        out.append(ProposerStats(
            proposer=name, proposals=len(rows), invalid=sum(r.status == "invalid" for r in rows),
            gated=len(gated), accepted=len(acc),
            accepted_delta=_mean([r.mean_diff for r in acc]),
            gated_delta=_mean([r.mean_diff for r in gated])))
    return out


def stats_table(store: Any, run: str | None = None) -> Table:
    t = Table(title=f"proposers{f' of run {escape(safe(run))}' if run else ''}")
    for col in ("proposer", "proposals", "invalid", "valid rate", "gated", "accepted",
                "accept rate", "accepted delta", "gated delta"):
        t.add_column(col, justify="left" if col == "proposer" else "right")
    for s in proposer_stats(store, run):
        t.add_row(escape(safe(s.proposer)), str(s.proposals), str(s.invalid), fmt(s.valid_rate),
                  str(s.gated), str(s.accepted), fmt(s.accept_rate),
                  fmt(s.accepted_delta), fmt(s.gated_delta))
    return t
