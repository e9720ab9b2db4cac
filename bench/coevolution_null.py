"""The false-accept check of bench/coevolution.py: null candidates gated against the seed.

A null candidate is a revision that cannot help: gated N times, the gate should accept about
alpha of them at most. Simulated from stored real per-task outcomes (RESULTS.md says so): the
base model under the seed incumbent is rolled out `draws` times on every val task with distinct
seeds (real episodes, stored in the bench store; their outcomes and partial credit are kept in
the bench's data JSON), and each of the N null candidates is gated with
`coevo.sequential.compare` under the env's gate policy (its own seed per candidate), its two
arms drawing each task's outcome as two DIFFERENT draws from that task's stored outcomes: a
revision that changes the samples but not their distribution, the case alpha must cover.
N >= 200 bounds the false-accept rate near alpha (one-sided 95% Clopper-Pearson bound).

The earlier "paired" variant (both arms sampling with the same seeds a revision the model never
sees) is not run: identical prompts and seeds give identical samples, every pair is a tie, and
a check that cannot fail says nothing. `null_candidate` (demo provenance only, which the runtime
never renders) stays as the admissibility check of that argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coevo.errors import CoevoError


def null_candidate(harness: Any, k: int) -> Any:
    """A harness child that differs only in demo provenance (`demos[i].source`), which the
    runtime never renders; raises CoevoError if that would not hold for this harness."""
    from coevo.propose.base import Candidate

    if not harness.demos:
        raise CoevoError(f"harness {harness.name}: the null candidate needs a demo to relabel")
    demos = [d.model_copy(update={"source": f"null-{k}:{d.source or ''}"}) for d in harness.demos]
    child = harness.child(demos=demos)
    if (child.render_system() != harness.render_system()
            or child.demo_messages() != harness.demo_messages()):
        raise CoevoError("null candidate: demo source changed what the model sees")
    return Candidate(asset=child, proposer="null", kind="harness")


def collect(base: Any, store: Any, draws: int) -> dict[str, Any]:
    """The seed incumbent's real outcomes and partial credit, `draws` seeded samples of every
    val task on the base model: {task id: [[outcome, partial], ...]} (infra failures left out)."""
    from coevo.config import RunConfig
    from coevo.evaluate import evaluate
    from coevo.gatestep import unit_reward
    from coevo.loop import build_parts, seed_incumbent

    cfg = RunConfig.from_mapping(base.model_dump(mode="json") | {"mode": "harness-only"})
    parts = build_parts(cfg)
    inc = seed_incumbent(cfg, store)
    res = evaluate(store, parts.env, inc.agent_assets(), parts.backend,
                   tasks=parts.env.tasks("val", cfg.splits.val_n), split="val",
                   samples=draws, seed=30_000, judge=parts.judge or parts.backend)
    out: dict[str, list[list[float | None]]] = {}
    for r in store.get_evaluation(res.evaluation).results:
        if r.status == "ok" and r.outcome is not None:
            out.setdefault(r.task_id, []).append([r.outcome, unit_reward(r.reward, inc.rubric)])
    return {"env": base.env, "draws": draws, "episodes": res.n_episodes, "tasks": out}


def simulate(outcomes: dict[str, Any], policy: Any, n: int, seed: int = 0) -> dict[str, Any]:
    """Gate `n` null candidates on the stored outcomes (module docstring)."""
    from coevo.sequential import compare

    rng = np.random.default_rng(seed)
    tasks = sorted(t for t, v in outcomes["tasks"].items() if len(v) >= 2)
    if not tasks:
        raise CoevoError("null check: no val task has two stored outcomes")
    rows = []
    for k in range(n):
        scores = {}
        for t in tasks:
            i, j = rng.choice(len(outcomes["tasks"][t]), size=2, replace=False)
            a, b = outcomes["tasks"][t][i], outcomes["tasks"][t][j]
            scores[t] = ({"outcome": a[0], "partial": a[1]}, {"outcome": b[0], "partial": b[1]})

        def run_arm(arm, ids, seeds, _s=scores):
            return [_s[x][0 if arm == "incumbent" else 1] for x in ids]

        ev, d = compare(run_arm, tasks, policy.model_copy(update={"seed": k}))
        differ = sum(1 for p in ev.pairs if p.values(policy.resolved_metric())[0]
                     != p.values(policy.resolved_metric())[1])
        rows.append({"accepted": d.accepted, "rollouts": d.rollouts, "pairs": len(ev.pairs),
                     "differing": differ})
    acc = sum(r["accepted"] for r in rows)
    return {"env": outcomes["env"], "policy": policy.model_dump(), "n": n, "accepted": acc,
            "rate": acc / n, "upper95": cp_upper(acc, n), "draws": outcomes["draws"],
            "tasks": len(tasks), "mean_rollouts": sum(r["rollouts"] for r in rows) / n,
            "pairs": sum(r["pairs"] for r in rows),
            "differing": sum(r["differing"] for r in rows)}


def cp_upper(k: int, n: int) -> float | None:
    """One-sided 95% Clopper-Pearson upper bound of a rate k/n."""
    if n == 0:
        return None
    from scipy import stats

    return 1.0 if k == n else float(stats.beta.ppf(0.95, k + 1, n - k))
