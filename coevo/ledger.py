"""Spend accounting of a run: what the loop charges, in which kinds, and when a round's budget
is used up.

Kinds (Store.charge / add_budget), one row per charge, summed:
- rollouts: episodes (RL rollouts, harness-only train rollouts, gate arms);
- tokens: tokens through the model at inference, prefilled + generated: every token of an
  episode's sequence (prompt, completions, tool observations) and of a proposer model call
  (prompt and output; a call replayed from a cassette computed nothing and costs none);
- train_tokens: tokens of the sequences an RL update trained on (each once);
- proposer_calls: LLM proposer model calls (`demos` makes none and is charged none);
- seconds: measured wall time (reported; it varies run to run, so it is a poor unit to match
  modes on and no replayed decision should hinge on it);
- eval_rollouts: the val-curve measurements, kept apart from the budgets modes are matched on.
Every charge carries an idempotency key (a unique index, migration 0004): work redone after a
crash (an RL step after the last checkpoint, a gate evaluation) is charged once.
"""

from __future__ import annotations

from typing import Any

BUDGET_KINDS = ("rollouts", "tokens", "proposer_calls", "seconds")
GATE_KEY = "gate:"  # the prefix of every gate-arm charge's key


def eval_charge(res: Any) -> dict[str, float]:
    """What an evaluation (coevo.evaluate.EvalResult) costs, in the budget kinds."""
    return {"rollouts": float(res.n_episodes), "tokens": float(res.tokens_total),
            "seconds": float(res.seconds)}


def first_exhausted(spent: dict[str, float], budgets: Any) -> str | None:
    """The first per-round budget that `spent` has used up, as text (None: within budget)."""
    for kind in BUDGET_KINDS:
        limit = getattr(budgets, kind)
        if limit is not None and spent.get(kind, 0.0) >= limit:
            return f"{kind} {spent[kind]:g} >= {limit:g}"
    return None


def over_budget(store: Any, run: str, r: int, budgets: Any) -> str | None:
    """The first per-round budget that round r has used up (None: within budget)."""
    return first_exhausted(store.budget_totals(run, round=r), budgets)


class GateLedger:
    """Round r's spend as the gate sees it, replayable after a crash: it starts from the
    round's charges without the gate's own (key prefix GATE_KEY) and adds each gate evaluation
    as the comparison runs or replays it, so a resumed gate checks its budget against exactly
    the figures an uninterrupted one saw."""

    def __init__(self, store: Any, run: str, r: int, budgets: Any):
        self.budgets = budgets
        self.spent = store.budget_totals(run, round=r, exclude_prefix=GATE_KEY)

    def add(self, amounts: dict[str, float]) -> None:
        for kind, amount in amounts.items():
            self.spent[kind] = self.spent.get(kind, 0.0) + amount

    def exhausted(self) -> str | None:
        return first_exhausted(self.spent, self.budgets)

    def rollouts_left(self) -> float | None:
        """Rollouts the round may still spend (None: no rollout budget)."""
        limit = self.budgets.rollouts
        return None if limit is None else limit - self.spent.get("rollouts", 0.0)
