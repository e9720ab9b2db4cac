"""`bettertogether`: DSPy BetterTogether style alternation of prompt and weight optimization
(Soylu et al. 2024, "Fine-Tuning and Prompt Optimization: Two Great Steps that Work Better
Together"; `dspy.BetterTogether`).

    stages = parse(bettertogether.strategy)          # "p -> w -> p" -> [p, w, p]
    for round r:
        stage = stages[r mod len(stages)]
        p: train rollouts of the incumbent; proposers revise it; each candidate and the
           incumbent on the whole val split (same checkpoint, same seeds); per asset kind the
           best candidate is accepted iff its val mean is strictly higher (no paired gate)
           -- or, with `select: gate`, the gated mode's paired sequential gate (family-wise
           levels, Holm, one winner per kind) under the current checkpoint
        w: an RL stage under the incumbent's assets (no proposals)

Each stage is recorded in its round's summary (`stage`: "p" or "w", `stage_index`), so
`coevo runs show` reads the strategy back in order.

Departures from DSPy's BetterTogether: a stage is one coevo round (a run with `rounds` equal
to the strategy's length runs it once; more rounds cycle through it), so each stage is
resumable and budgeted like any round; the prompt step is coevo's proposers (demos, harness,
skills, rubrics, gepa: whatever the run lists) instead of BootstrapFewShotWithRandomSearch or
MIPRO, selecting on val by mean as those optimizers do (`select: gate` swaps in coevo's gate);
the weight step is coevo's RL stage (GRPO on the incumbent's rollouts with the verifier's
reward) instead of BootstrapFinetune's
supervised fine-tuning on the traces the metric passed; the prompt step's train rollouts run
on the current checkpoint, as BetterTogether bootstraps its traces with the current weights.
"""

from __future__ import annotations

from typing import Any

from coevo.modes.common import note, pending_of, select_by_mean
from coevo.propose.base import Candidate, Incumbent

POLICY = "bettertogether"


def stage_of(run: Any, r: int) -> str:
    stages = run.cfg.bettertogether.stages
    return stages[r % len(stages)]


def bettertogether_round(run: Any, r: int, incumbent: Incumbent) -> tuple[Incumbent, list[Candidate]]:
    from coevo.gatestep import gate_step
    from coevo.loop import collect_train_rollouts, propose_step, rl_step

    stage = stage_of(run, r)
    note(run, r, stage=stage, stage_index=r % len(run.cfg.bettertogether.stages),
         strategy=run.cfg.bettertogether.strategy)
    if stage == "w":
        return rl_step(run, r, incumbent), []
    collect_train_rollouts(run, r, incumbent)
    trajs = run.store.trajectories(run.id, round=r, split="train")
    cands = propose_step(run, r, incumbent, trajs)
    if run.cfg.bettertogether.select == "gate":
        accepted = gate_step(run, r, incumbent, cands, gated=True)
    else:
        accepted, pending = pending_of(cands)
        if pending:
            accepted = select_by_mean(run, r, incumbent, pending, POLICY)
    for cand in accepted:
        incumbent = incumbent.with_candidate(cand)
    return incumbent, accepted
