"""Sequential comparison of a candidate with the incumbent: the gate's evidence, gathered in
stages that stop as soon as the family's verdict is settled (`compare`, `compare_family`).

The planned tasks are evaluated in a seeded random order: a screen of `screen_size` tasks,
then chunks of `chunk_size`. A candidate belongs to a family of m candidates decided together
by Holm (coevo/gate.py, `decide_family`). After every stage:
1. Exact curtailment for acceptance: fill every unevaluated task with the worst possible
   difference (-1) and run the policy's verdict at alpha / m (the strictest Holm level; alpha
   for a lone candidate). The sign-test p-value can only grow when a task becomes a loss, and
   the bootstrap bound is monotone in every difference (fixed resampling matrix), so if even
   this worst completion accepts, the full evaluation accepts at alpha / m too, and Holm
   accepts it whatever the other candidates' p-values are.
2. Exact curtailment for rejection: if even the best completion (+1 everywhere) is rejected at
   alpha (the most lenient Holm level), the full evaluation rejects under Holm too.
3. Futility (stochastic curtailment): at the screen, reject when losses >= wins +
   `screen_reject_margin`; once `futility_from` of the planned tasks are in, reject when the
   Bayesian predictive probability that the full evaluation accepts at alpha is below
   `futility` (gatestats.predictive_*).
After the last stage with neither settled (it accepts at alpha but not at alpha / m) the
stage's action is "holm": the round's step-down decides. Measured on
bench/gate_efficiency.py's mix (null, +5, +10, -10 pp, 200 tasks, one candidate): ~0.55x the
rollouts of the full evaluation at ~98% agreement; the family figures (false accepts and power
with 3 candidates a round) are in its output.
Why the error control holds: a comparison accepts only through rule 1 (or Holm after a full
evaluation), i.e. only when Holm over the fixed-sample tests would accept it. Rules 2-3 only
ever reject, so they cost power (measured as disagreement with the full evaluation), never
type-I error. Departure from the curtailment literature (Lan, Simon & Halperin 1982): futility
uses predictive power rather than conditional power under a fixed alternative, and with dropped
pairs the bootstrap half of rule 1 is exact only up to resampling noise (a dropped worst-case
task can only raise the mean; the sign-test half stays exact, as a drop acts like a tie).

The gate never sees the test split: `compare` raises on any task marked split "test" or whose
id is in `test_guard`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from coevo.errors import InfraError
from coevo.gate import (
    GATE_POLICIES,
    Arm,
    Decision,
    Evidence,
    GateError,
    GatePolicy,
    PairedOutcome,
    StageRecord,
    _counts,
    decide,
    decide_family,
    paired_stats,
    task_diffs,
)
from coevo.gatestats import sign_test_p

class RunArm(Protocol):
    """Contract: score `arm` on `tasks` (task i with seed `seeds[i]`; a task appears once per
    sample) under the checkpoint held fixed for this comparison. Returns one entry per task:
    the outcome in [0, 1], a mapping {"outcome": x, "partial": y}, or None for an
    infrastructure failure (missing data). Raising coevo.errors.InfraError marks the whole
    call as failed. The same (task, seed) must give the same sample for either arm's model."""

    def __call__(self, arm: Arm, tasks: list[Any], seeds: list[int]) -> Sequence[Any]: ...


def _task_id(task: Any, where: str) -> str:
    if isinstance(task, str):
        return task
    tid = task.get("id") if isinstance(task, Mapping) else getattr(task, "id", None)
    if not isinstance(tid, str) or not tid:
        raise GateError(f"{where}: task has no string 'id'")
    return tid


def _task_split(task: Any) -> str | None:
    if isinstance(task, str):
        return None
    if isinstance(task, Mapping):
        return task.get("split") or (task.get("metadata") or {}).get("split")
    return getattr(task, "split", None) or (getattr(task, "metadata", None) or {}).get("split")


def check_test_guard(tasks: Sequence[Any], test_guard: Collection[str] = ()) -> list[str]:
    """Task ids, or GateError if any task is from the test split or listed in `test_guard`."""
    forbidden = set(test_guard)
    ids = []
    for i, task in enumerate(tasks):
        tid = _task_id(task, f"tasks[{i}]")
        if _task_split(task) == "test":
            raise GateError(f"tasks[{i}] ({tid!r}): split 'test' is never shown to the gate")
        if tid in forbidden:
            raise GateError(f"tasks[{i}] ({tid!r}): id is in test_guard (held-out test task)")
        ids.append(tid)
    if len(set(ids)) != len(ids):
        raise GateError("tasks: duplicate task ids (the gate pairs by id)")
    return ids


def seed_for(task_id: str, sample: int, base: int = 0) -> int:
    """Stable per-(task, sample) seed: the same wherever and in whatever chunk it is run."""
    h = hashlib.sha256(f"{base}:{task_id}:{sample}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


def _split_value(v: Any, where: str) -> tuple[float | None, float | None]:
    if v is None:
        return None, None
    if isinstance(v, Mapping):
        unknown = set(v) - {"outcome", "partial"}
        if unknown:
            raise GateError(f"{where}: unknown keys {sorted(unknown)} (expected 'outcome', 'partial')")
        return v.get("outcome"), v.get("partial")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v), None
    raise GateError(f"{where}: expected a float, None or {{'outcome','partial'}}, got {type(v).__name__}")


def _run(run_arm: RunArm, arm: Arm, tasks: list[Any], seeds: list[int]) -> list[tuple[float | None, float | None]]:
    try:
        out = list(run_arm(arm, tasks, seeds))
    except InfraError:
        return [(None, None)] * len(tasks)
    if len(out) != len(tasks):
        raise GateError(f"run_arm({arm!r}): returned {len(out)} results for {len(tasks)} tasks")
    return [_split_value(v, f"run_arm({arm!r})[{i}]") for i, v in enumerate(out)]


def _pairs(run_arm: RunArm, tasks: list[Any], ids: list[str], samples: int, seed: int) -> list[PairedOutcome]:
    batch = [t for t in tasks for _ in range(samples)]
    keys = [(tid, s) for tid in ids for s in range(samples)]
    seeds = [seed_for(tid, s, seed) for tid, s in keys]
    inc = _run(run_arm, "incumbent", batch, seeds)
    cand = _run(run_arm, "candidate", batch, seeds)
    out = []
    for (tid, s), (io, ip), (co, cp) in zip(keys, inc, cand):
        bad = io is None or co is None
        try:
            out.append(PairedOutcome(task_id=tid, sample=s, incumbent=io, candidate=co, incumbent_partial=ip,
                                     candidate_partial=cp, status="infra_error" if bad else "ok"))
        except ValueError as e:
            raise GateError(f"run_arm result for task {tid!r} sample {s}: {e}") from None
    return out


def _accepts(evidence: Evidence, policy: GatePolicy, family_size: int = 1) -> bool:
    """The policy's verdict with the worst-case completion, its p-value multiplied by
    `family_size` (Bonferroni: the strictest Holm level), without the reporting-only work."""
    s = paired_stats(evidence, policy, report=False)
    return GATE_POLICIES.get(policy.name).verdict(s, policy, min(1.0, s.p_bound * family_size))[0]


def _look(evidence: Evidence, policy: GatePolicy, remaining: int, screen: bool,
          family_size: int = 1) -> tuple[str, str, float | None]:
    """(action, rule, predictive P(accept)) after a stage; see the module docstring, steps 1-3."""
    m = family_size
    at = f" at alpha/{m} (the family's strictest Holm level)" if m > 1 else ""
    if _accepts(evidence, policy, m):
        why = "full evaluation accepts" if not remaining else f"curtailment: accepts even if all {remaining} remaining tasks are losses"
        return "accept", why + at, None
    if not remaining:
        if m > 1 and _accepts(evidence, policy):
            return "holm", (f"every planned task evaluated: accepts at alpha but not at alpha/{m}; "
                            "Holm across the round decides"), None
        return "reject", "full evaluation rejects", None
    best = evidence.model_copy(update={"pairs": evidence.pairs + [
        PairedOutcome(task_id=t, incumbent=0.0, candidate=1.0, incumbent_partial=0.0, candidate_partial=1.0)
        for t in _unevaluated(evidence)]})
    if not _accepts(best, policy):
        return "reject", f"curtailment: rejects even if all {remaining} remaining tasks are wins", None
    metric = policy.resolved_metric()
    diffs = np.array(list(task_diffs(evidence, metric)[0].values()), dtype=float)
    w, l, _ = _counts(diffs)
    if screen and l >= w + policy.screen_reject_margin:
        return "reject", f"screen: losses {l} >= wins {w} + margin {policy.screen_reject_margin}", None
    p_acc = GATE_POLICIES.get(policy.name).accept_probability(diffs, remaining, policy)
    seen = len(evidence.planned) - remaining
    if p_acc < policy.futility and seen >= policy.futility_from * len(evidence.planned):
        return "reject", f"futility: predictive P(full evaluation accepts)={p_acc:.3f} < {policy.futility:g}", p_acc
    return "continue", f"predictive P(full evaluation accepts)={p_acc:.3f}", p_acc


def _unevaluated(evidence: Evidence) -> list[str]:
    done = {p.task_id for p in evidence.pairs}
    return [t for t in evidence.planned if t not in done]


def compare(
    run_arm: RunArm,
    tasks: Sequence[Any],
    policy: GatePolicy | None = None,
    *,
    samples: int = 1,
    seed: int = 0,
    test_guard: Collection[str] = (),
    sequential: bool = True,
    family_size: int = 1,
) -> tuple[Evidence, Decision]:
    """Score incumbent and candidate on the same tasks and seeds, in stages, and decide.

    `tasks`: Task models, mappings or ids (a split marker is read from `.split` or
    `metadata["split"]`). The first `policy.max_tasks` are planned; they are evaluated in an
    order shuffled by `policy.seed` so early stages are a random sample, not the first family.
    `sequential=False` evaluates every planned task (the reference the bench compares with).
    `family_size`: the m candidates of the round this one is decided with (module docstring);
    the returned Decision is Holm over m with the others untested (p = 1), i.e. Bonferroni;
    the loop decides the round with `decide_family` over every comparison's Evidence.
    """
    if family_size < 1:
        raise GateError(f"family_size: must be >= 1, got {family_size}")
    policy = policy or GatePolicy()
    if samples < 1:
        raise GateError(f"samples: must be >= 1, got {samples}")
    ids = check_test_guard(tasks, test_guard)
    planned = list(zip(ids, tasks))[: policy.max_tasks]
    if not planned:
        raise GateError("tasks: nothing to evaluate")
    order = planned[:]
    random.Random(policy.seed).shuffle(order)
    evidence = Evidence(planned=[t for t, _ in planned])
    sizes = [len(order)] if not sequential else [min(policy.screen_size, len(order))]
    while sequential and sum(sizes) < len(order):
        sizes.append(min(policy.chunk_size, len(order) - sum(sizes)))
    done = 0
    for k, size in enumerate(sizes):
        chunk = order[done : done + size]
        done += size
        new = _pairs(run_arm, [t for _, t in chunk], [t for t, _ in chunk], samples, seed)
        spent = 2 * len(new)
        evidence = evidence.model_copy(update={"pairs": evidence.pairs + new, "rollouts": evidence.rollouts + spent})
        action, why, p_acc = _look(evidence, policy, len(order) - done,
                                   screen=(k == 0 and sequential), family_size=family_size)
        d = np.array(list(task_diffs(evidence, policy.resolved_metric())[0].values()), dtype=float)
        w, l, t = _counts(d)
        name = "full" if not sequential else ("screen" if k == 0 else f"chunk {k}")
        stage = StageRecord(name=name, tasks=size, tasks_total=done, rollouts=spent, wins=w, losses=l, ties=t,
                            p_value=sign_test_p(w, l), p_accept=p_acc, action=action, rule=why)
        evidence = evidence.model_copy(update={"stages": evidence.stages + [stage]})
        if action != "continue":
            break
    if family_size == 1:
        return evidence, decide(evidence, policy)
    return evidence, decide_family([evidence], policy, family_size)[0]


def compare_family(run_arms: Sequence[RunArm], tasks: Sequence[Any], policy: GatePolicy | None = None,
                   **kw: Any) -> list[tuple[Evidence, Decision]]:
    """Compare each candidate's arms (one RunArm per candidate) on the same tasks, each stage
    at the family's levels, then decide them together (`decide_family`, Holm over all)."""
    policy = policy or GatePolicy()
    m = len(run_arms)
    evidences = [compare(arm, tasks, policy, family_size=m, **kw)[0] for arm in run_arms]
    return list(zip(evidences, decide_family(evidences, policy, m)))
