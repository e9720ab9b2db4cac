"""When a run stops before its last round: the budget is used up (`budgets.stop_run_on_exhaustion`),
no round accepted anything for `budgets.patience` rounds, or the proposers only repeat what the
gate already rejected against an incumbent that nothing will change (`budgets.stop_on_repeats`).

The last rule is for modes without an RL stage (harness-only, skillopt): after a round that
accepted nothing the next round starts from the same assets and no checkpoint, so a
deterministic proposer (knobs, a fixed grid) proposes the same candidates again and the gate,
reusing its stored evidence, repeats the same rejections. Measured on BFCL (`bfcl-joint` in
bench/README.md): seed 1 re-proposed copy, greedy and both for 5 rounds after round 0 rejected
them. A mode with RL is never stopped by it: its next RL stage changes the checkpoint the
candidates are judged under."""

from __future__ import annotations

from typing import Any

from coevo.gatestep import gate_seed, prior_rejections
from coevo.ledger import over_budget


def why_stop(run: Any, r: int, incumbent: Any, accepted: list[Any]) -> str | None:
    """Why the run stops after round r (None: it goes on). `incumbent`: the one round r ends
    with; `accepted`: what round r accepted (reviews included)."""
    budgets = run.cfg.budgets
    exhausted = over_budget(run.store, run.id, r, budgets)
    if exhausted and budgets.stop_run_on_exhaustion:
        return f"budget exhausted: {exhausted}"
    done = [x for x in run.store.rounds(run.id) if x.status == "done" and x.index < r]
    patience = budgets.patience
    if patience is not None and r + 1 >= patience and not accepted:
        recent = [x.summary.get("accepted", []) for x in done if x.index > r - patience]
        if len(recent) == patience - 1 and not any(recent):
            return f"no accepted proposal in the last {patience} rounds"
    if (budgets.stop_on_repeats and not accepted and not run.mode.train
            and not run.cfg.gate.human_review):  # a review may still change the incumbent
        repeated = repeats(run, r, incumbent)
        if repeated:
            return (f"round {r} proposed only candidates the gate already rejected against this "
                    f"incumbent ({repeated}), and no RL stage changes it")
    return None


def repeats(run: Any, r: int, incumbent: Any) -> int:
    """How many candidates round r proposed, if the gate judged every valid one by repeating
    a rejection from an earlier round gated with this same incumbent (0 otherwise): the
    stretch and the verdicts are the gate's own (coevo/gatestep.py `gate_seed`,
    `prior_rejections`), so a rejection for lack of budget never counts."""
    mine = [p for p in run.store.proposals(run.id, round=r) if p.status != "invalid" and p.candidate]
    if not mine or any(p.kind == "rubric" for p in mine):  # rubric candidates are judged afresh
        return 0
    base, earlier = gate_seed(run, r, incumbent)
    seen = prior_rejections(run.store, run.id, earlier, base, len(mine))
    return len(mine) if all(p.candidate in seen for p in mine) else 0
