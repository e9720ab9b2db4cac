"""Budget matching for bench/coevolution.py: every mode spends the same number of model tokens.

The unit, the same for all modes: tokens through the model, as the loop charges them
(coevo/ledger.py): `tokens` (prefilled + generated at inference: every episode's whole
sequence, every LLM proposer call's prompt and output; a proposer that calls no model, such as
`demos`, costs nothing) plus `train_tokens` (the sequences an RL update trained on, each
once). Measured seconds are reported next to it, not matched on: they move with the shared
machine's load.

The loop's budgets are per round, so the bench drives the total itself through the loop's
resume path (only `rounds` and `budgets` may change on resume): it plans round r + 1 from what
is left and the costs it has measured so far (`Rates`: the last round's mean cost per unit of
work; before the first round, the env's calibration). A full round is admitted when its fixed
part (the RL stage, the LLM proposer calls, harness-only's train rollouts) and, in gated modes,
one gate screen fit; its rollout budget (`budgets.rollouts`) then lets the loop's gate plan
only the val tasks the rest can pay for in the worst case (coevo/gatestep.affordable), so a
round does not overshoot by a whole comparison. When a full round no longer fits, a mode that
trains and proposes (gated, ungated) spends what is left on RL-only rounds (no proposers) while
an RL stage fits, as weight-only does; harness-only cannot train, and its gate already plans
down to one screen, so it stops when not even that fits. What is left is less than the
cheapest round a mode can run, and the table reports what each mode actually spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Calls an LLM proposer makes per round at most (the bench's proposers; gepa is not run).
_CALLS = {"demos": 0, "knobs": 0, "harness": 1, "skills": 2, "rubrics": 1}


def cost(spent: dict[str, float]) -> float:
    """Model tokens of a budget_totals dict (the bench's unit)."""
    return spent.get("tokens", 0.0) + spent.get("train_tokens", 0.0)


@dataclass(frozen=True)
class Rates:
    """Model tokens per unit of work: an evaluation episode (gate arm, harness-only train
    rollout), an RL rollout with its share of the update, an LLM proposer call."""

    eval: float
    rl: float
    call: float

    def update(self, seen: "Rates") -> "Rates":
        """These rates with the ones a round measured, where it measured any (> 0)."""
        return Rates(*(b if b > 0 else a for a, b in zip(
            (self.eval, self.rl, self.call), (seen.eval, seen.rl, seen.call))))


@dataclass(frozen=True)
class Plan:
    """The next round: `tail` (RL only, no proposers), the round's rollout budget for the
    loop (None: none needed) and its estimated worst-case cost."""

    tail: bool
    rollouts: int | None
    estimate: float


def proposer_calls(cfg: Any) -> int:
    """LLM proposer calls a round makes at most (harness: `candidates` calls)."""
    n = 0
    for p in cfg.proposers:
        n += _CALLS.get(p.name, 1) * (int(p.options.get("candidates", 1)) if p.name == "harness" else 1)
    return n


def plan_round(cfg: Any, mode: str, rates: Rates, left: float, round: int = 0) -> Plan | None:
    """The next round (index `round`) `mode` can afford with `left` tokens, or None (module
    docstring; the peer modes: `plan_peer`)."""
    from coevo.loop import MODES

    m, st, sp, gate = MODES[mode], cfg.rl.stage, cfg.splits, cfg.gate
    if m.peer is not None:
        return plan_peer(cfg, mode, rates, left, round)
    rl = st.steps * st.tasks_per_step * st.samples if m.train else 0
    train = (sp.train_n or 16) * sp.train_samples if m.propose and not m.train else 0
    fixed = rl * rates.rl + train * rates.eval
    if m.propose:
        fixed += proposer_calls(cfg) * rates.call
    screen = 2 * min(gate.screen_size, sp.val_n or 40) * sp.val_samples if m.propose and m.gated else 0
    if fixed + screen * rates.eval <= left:
        if not screen:
            return Plan(tail=False, rollouts=None, estimate=fixed)
        gate_rollouts = int((left - fixed) // rates.eval)
        return Plan(tail=False, rollouts=rl + train + gate_rollouts, estimate=left)
    if m.train and m.propose and rl * rates.rl <= left:
        return Plan(tail=True, rollouts=None, estimate=rl * rates.rl)
    return None


def trains(cfg: Any, mode: str, r: int) -> bool:
    """Round r's train-split episodes are RL rollouts (else train rollouts for proposers)."""
    from coevo.loop import MODES

    if mode == "bettertogether":
        st = cfg.bettertogether.stages
        return st[r % len(st)] == "w"
    return MODES[mode].train


def plan_peer(cfg: Any, mode: str, rates: Rates, left: float, r: int) -> Plan | None:
    """A peer mode's round (coevo/modes/), worst case: its RL steps (fst: fst.every), its
    train rollouts (bettertogether's p stages, skillopt), its proposer calls and a whole-val
    evaluation of the incumbent and of every candidate (fst: the seed too in round 0;
    skillopt: at most max_edits candidates). No RL-only tail: these methods have none, and a
    round is never cut short by a rollout budget (they have no gate to plan down)."""
    st, sp = cfg.rl.stage, cfg.splits
    val = (sp.val_n or 40) * sp.val_samples
    train = (sp.train_n or 16) * sp.train_samples
    calls = proposer_calls(cfg)
    cands = max(calls, len(cfg.proposers))
    if mode == "fst":
        rl = (cfg.fst.every or st.steps) * st.tasks_per_step * st.samples
        est = rl * rates.rl + calls * rates.call + (cands + (r == 0)) * val * rates.eval
    elif mode == "bettertogether" and trains(cfg, mode, r):
        est = st.steps * st.tasks_per_step * st.samples * rates.rl
    else:  # a prompt step / a SkillOpt step
        n = min(cands, cfg.skillopt.max_edits) if mode == "skillopt" else cands
        est = train * rates.eval + calls * rates.call + (1 + n) * val * rates.eval
    return Plan(tail=False, rollouts=None, estimate=est) if est <= left else None


def measured(store: Any, run: str, r: int, trains: bool) -> Rates:
    """The mean per-unit costs round r of `run` had (0 for a kind it had none of), from its
    stored episodes (the uncharged val-curve ones count for the evaluation rate) and charges.
    `trains`: the round's train-split episodes are RL rollouts (else harness-only's)."""
    rec = store.get_round(run, r)
    tracked = {t.id for e in (rec.summary.get("evaluations") or {}).values()
               for t in store.trajectories(evaluation=e)}
    trajs = store.trajectories(run, round=r)
    spent = store.budget_totals(run, round=r)
    rl = [len(t.token_ids) for t in trajs if trains and t.split == "train"]
    evals = [len(t.token_ids) for t in trajs if not (trains and t.split == "train")]
    charged = sum(len(t.token_ids) for t in trajs if t.id not in tracked)
    calls = spent.get("proposer_calls", 0.0)
    return Rates(eval=sum(evals) / len(evals) if evals else 0.0,
                 rl=(sum(rl) + spent.get("train_tokens", 0.0)) / len(rl) if rl else 0.0,
                 call=max(0.0, spent.get("tokens", 0.0) - charged) / calls if calls else 0.0)


def calibrate(res: Any, call_guess: float) -> Rates:
    """Rates before a run's first round, from an evaluation of the seed incumbent (an
    EvalResult): its mean tokens per episode for an evaluation episode, twice that for an RL
    rollout (its update trains on the same tokens again), `call_guess` for a proposer call."""
    per = res.tokens_total / max(res.n_episodes, 1)
    return Rates(eval=math.ceil(per), rl=math.ceil(2 * per), call=call_guess)
