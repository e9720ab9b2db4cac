"""The validation gate: does a candidate (harness / skill / rubric revision) beat the incumbent?

Both arms are scored by the same checkpoint on the same validation tasks and seeds, so the
evidence is a list of *paired* outcomes. `decide(evidence, policy)` is a pure function from
those pairs to a verdict with its reason; `compare(run_arm, tasks, policy)` gathers the pairs
in stages and stops as soon as the verdict is settled.

Policies (registry `GATE_POLICIES`, looked up by `GatePolicy.name`):
- `paired` (default): per-task mean difference d_i = candidate - incumbent. Accept iff the
  one-sided (1 - alpha) percentile-bootstrap lower bound of mean(d) exceeds `min_delta` AND
  the one-sided exact sign test on wins vs losses (McNemar's exact test for binary outcomes),
  Holm-adjusted across the candidates of a round, has p <= alpha. The sign test is the part
  with exact error control; the bootstrap bound adds the effect-size requirement.
- `strict`: accept iff the candidate's mean is strictly higher (by more than min_delta): what
  GEPA / SkillOpt do. No error control; kept for the ablation.
- `soft`: `paired` on the partial-credit metric instead of the verified outcome.

Infrastructure failures are missing data: a pair with either side None or status
"infra_error" is dropped from both arms and counted in `n_dropped`, never scored 0.

Sequential comparison (`compare`). The planned tasks are evaluated in a seeded random order:
a screen of `screen_size` tasks, then chunks of `chunk_size`. After every stage:
1. Exact curtailment for acceptance: fill every unevaluated task with the worst possible
   difference (-1) and run `decide`. The sign-test p-value can only grow when a task becomes
   a loss, and the bootstrap bound is monotone in every difference (fixed resampling matrix),
   so if even this worst completion accepts, the full evaluation accepts too. `decide` itself
   treats unevaluated planned tasks this way, so the returned Decision is reproducible from the
   Evidence alone.
2. Exact curtailment for rejection: if even the best completion (+1 everywhere) is rejected,
   the full evaluation rejects.
3. Futility (stochastic curtailment): at the screen, reject when losses >= wins +
   `screen_reject_margin`; once `futility_from` of the planned tasks are in, reject when the
   Bayesian predictive probability that the full evaluation accepts is below `futility`
   (gatestats.predictive_*). Measured on bench/gate_efficiency.py's mix (null, +5, +10, -10 pp,
   200 tasks): ~0.55x the rollouts of the full evaluation at ~98% agreement; accepted
   candidates cost ~0.9-1.0x because rule 1 is exact.
Why the error control holds: the sequential gate accepts only through rule 1, i.e. only when the
fixed-sample test on all planned tasks accepts. So its false-accept rate is at most the
fixed-sample test's, which is at most alpha (exact sign test; with Holm, family-wise). Rules 2-3
only ever reject, so they cost power (measured in bench/gate_efficiency.py as disagreement with
the full evaluation), never type-I error. Departure from the curtailment literature (Lan, Simon
& Halperin 1982): futility uses predictive power rather than conditional power under a fixed
alternative, and with dropped pairs the bootstrap half of rule 1 is exact only up to resampling
noise (a dropped worst-case task can only raise the mean; the sign-test half stays exact, as a
drop acts like a tie).

The gate never sees the test split: `compare` raises on any task marked split "test" or whose
id is in `test_guard`.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from scipy import stats

from coevo.errors import CoevoError, InfraError
from coevo.gatestats import (
    bootstrap_bounds,
    holm,
    predictive_mean_clears,
    predictive_sign_pass,
    sign_test_p,
)
from coevo.registry import Registry

Metric = Literal["outcome", "partial"]
Arm = Literal["incumbent", "candidate"]
_TIE = 1e-12  # |d| at or below this is a tie (float noise from averaging samples)


class GateError(CoevoError):
    """Bad gate input (a test-split task, a malformed run_arm result): names the field."""


# --------------------------------------------------------------------------- data models


class PairedOutcome(BaseModel):
    """One task x sample, scored for both arms under the same checkpoint and seed."""

    model_config = ConfigDict(extra="forbid")
    task_id: str
    sample: int = 0
    incumbent: float | None = Field(None, ge=0.0, le=1.0)  # verified outcome; None = missing
    candidate: float | None = Field(None, ge=0.0, le=1.0)
    incumbent_partial: float | None = Field(None, ge=0.0, le=1.0)  # rubric partial credit
    candidate_partial: float | None = Field(None, ge=0.0, le=1.0)
    status: Literal["ok", "infra_error"] = "ok"

    def values(self, metric: Metric) -> tuple[float | None, float | None]:
        if metric == "partial":
            return self.incumbent_partial, self.candidate_partial
        return self.incumbent, self.candidate

    def usable(self, metric: Metric) -> bool:
        inc, cand = self.values(metric)
        return self.status == "ok" and inc is not None and cand is not None


class StageRecord(BaseModel):
    """What one stage of `compare` evaluated, the running statistics, and what it concluded."""

    model_config = ConfigDict(extra="forbid")
    name: str  # "screen", "chunk 1", ..., or "full"
    tasks: int  # tasks evaluated in this stage
    tasks_total: int  # cumulative
    rollouts: int  # spent in this stage (both arms, all samples)
    wins: int
    losses: int
    ties: int
    p_value: float  # sign test on the tasks seen so far
    p_accept: float | None = None  # predictive probability that the full evaluation accepts
    action: Literal["continue", "accept", "reject"]
    rule: str  # why this action


class Evidence(BaseModel):
    """Paired outcomes plus how they were gathered. `planned` lists the task ids the full
    evaluation would cover; planned ids with no pair were not evaluated (a sequential stop)."""

    model_config = ConfigDict(extra="forbid")
    pairs: list[PairedOutcome] = Field(default_factory=list)
    rollouts: int = Field(0, ge=0)
    stages: list[StageRecord] = Field(default_factory=list)
    planned: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> "Evidence":
        seen: set[tuple[str, int]] = set()
        for i, p in enumerate(self.pairs):
            key = (p.task_id, p.sample)
            if key in seen:
                raise ValueError(f"pairs[{i}]: duplicate pair for task {p.task_id!r} sample {p.sample}")
            seen.add(key)
        if len(set(self.planned)) != len(self.planned):
            raise ValueError("planned: duplicate task ids")
        return self


class GatePolicy(BaseModel):
    """Gate configuration (one block of the run YAML)."""

    model_config = ConfigDict(extra="forbid")
    name: str = "paired"
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    min_delta: float = Field(0.0, ge=-1.0, lt=1.0)
    n_boot: int = Field(2000, ge=100)
    seed: int = 0
    screen_size: int = Field(20, ge=1)
    screen_reject_margin: int = Field(3, ge=1)  # reject at the screen if losses >= wins + this
    chunk_size: int = Field(10, ge=1)
    max_tasks: int | None = Field(None, ge=1)
    metric: Metric | None = None  # None: the policy's own (paired/strict: outcome, soft: partial)
    futility: float = Field(0.1, ge=0.0, lt=1.0)  # predictive P(full accepts) below this: stop
    # The predictive probability follows the early trend too readily (measured: a third of the
    # futility stops at 20-40 of 200 tasks were flips), so it applies only from this fraction on.
    futility_from: float = Field(0.25, ge=0.0, le=1.0)

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in GATE_POLICIES:  # a ValueError, so pydantic reports the field
            raise ValueError(f"unknown gate policy {name!r}; known: {', '.join(GATE_POLICIES.names())}")
        return name

    def resolved_metric(self) -> Metric:
        return self.metric or GATE_POLICIES.get(self.name).default_metric


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    accepted: bool
    reason: str
    statistic: dict[str, float]
    policy: str
    rollouts: int


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class PairedStats:
    """Everything a rule may look at. `*_bound` fields are computed with unevaluated planned
    tasks filled by the worst case (-1); they equal the observed ones when nothing is missing."""

    n: int
    wins: int
    losses: int
    ties: int
    n_dropped: int
    n_unevaluated: int
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    incumbent_mean: float
    candidate_mean: float
    mean_diff_bound: float
    ci_low_bound: float
    p_bound: float

    def as_dict(self, p_adjusted: float) -> dict[str, float]:
        d = {k: float(v) for k, v in self.__dict__.items()}
        d["p_adjusted"] = float(p_adjusted)
        return d


def _counts(d: np.ndarray) -> tuple[int, int, int]:
    return int((d > _TIE).sum()), int((d < -_TIE).sum()), int((np.abs(d) <= _TIE).sum())


def task_diffs(evidence: Evidence, metric: Metric) -> tuple[dict[str, float], dict[str, tuple[float, float]], int]:
    """Per-task mean difference over usable samples, per-task arm means, and pairs dropped."""
    if metric == "partial" and evidence.pairs and not any(
        p.incumbent_partial is not None or p.candidate_partial is not None for p in evidence.pairs
    ):
        raise GateError("evidence.pairs: metric 'partial' requested but no pair has incumbent_partial/candidate_partial")
    sums: dict[str, list[float]] = {}  # task id -> [incumbent sum, candidate sum, samples]
    dropped = 0
    partial = metric == "partial"
    for p in evidence.pairs:
        inc, cand = (p.incumbent_partial, p.candidate_partial) if partial else (p.incumbent, p.candidate)
        if p.status != "ok" or inc is None or cand is None:
            dropped += 1
            continue
        acc = sums.setdefault(p.task_id, [0.0, 0.0, 0])
        acc[0] += inc
        acc[1] += cand
        acc[2] += 1
    arms = {t: (a / k, b / k) for t, (a, b, k) in sums.items()}
    diffs = {t: b - a for t, (a, b) in arms.items()}
    return diffs, arms, dropped


def paired_stats(evidence: Evidence, policy: GatePolicy, *, report: bool = True) -> PairedStats:
    """Statistics of `evidence`; `report=False` skips the observed-data bootstrap, which only the
    reason text shows (the verdict uses the `*_bound` fields), to keep sequential looks cheap."""
    metric = policy.resolved_metric()
    diffs, arms, dropped = task_diffs(evidence, metric)
    ids = sorted(diffs)  # order-independent: the bootstrap indexes tasks by sorted id
    d = np.array([diffs[t] for t in ids], dtype=float)
    evaluated = {p.task_id for p in evidence.pairs}
    missing = sorted(t for t in evidence.planned if t not in evaluated)
    wins, losses, ties = _counts(d)
    p = sign_test_p(wins, losses)
    need_observed = report or not missing
    lo, hi = bootstrap_bounds(d, policy.alpha, policy.n_boot, policy.seed) if need_observed else (np.nan, np.nan)
    if missing:
        fill = {**diffs, **{t: -1.0 for t in missing}}
        d_fill = np.array([fill[t] for t in sorted(fill)], dtype=float)
        w_f, l_f, _ = _counts(d_fill)
        lo_f = bootstrap_bounds(d_fill, policy.alpha, policy.n_boot, policy.seed)[0]
        mean_f, p_f = float(d_fill.mean()), sign_test_p(w_f, l_f)
    else:
        lo_f, p_f = lo, p
        mean_f = float(d.mean()) if len(d) else float("nan")
    inc = np.array([arms[t][0] for t in ids]) if ids else np.array([np.nan])
    cand = np.array([arms[t][1] for t in ids]) if ids else np.array([np.nan])
    return PairedStats(
        n=len(d), wins=wins, losses=losses, ties=ties, n_dropped=dropped, n_unevaluated=len(missing),
        mean_diff=float(d.mean()) if len(d) else float("nan"), ci_low=lo, ci_high=hi, p_value=p,
        incumbent_mean=float(inc.mean()), candidate_mean=float(cand.mean()),
        mean_diff_bound=mean_f, ci_low_bound=lo_f, p_bound=p_f,
    )


# --------------------------------------------------------------------------- policies


class GateRule(Protocol):
    """Contract of a gate policy: `verdict` is pure (numbers in, verdict and reason out; the
    reason names every condition with its numbers); `accept_probability` estimates, for the
    futility stop only, the chance that the full evaluation accepts given the tasks seen so far.
    Neither may look at anything but its arguments."""

    default_metric: Metric
    uses_p_value: bool

    def verdict(self, s: PairedStats, policy: GatePolicy, p_adjusted: float) -> tuple[bool, str]: ...

    def accept_probability(self, diffs: np.ndarray, remaining: int, policy: GatePolicy) -> float: ...


GATE_POLICIES: Registry[GateRule] = Registry("gate policy")


def _tail(s: PairedStats) -> str:
    extra = f", not evaluated {s.n_unevaluated} (counted as losses)" if s.n_unevaluated else ""
    return f" [wins {s.wins}, losses {s.losses}, ties {s.ties}, n={s.n}, dropped {s.n_dropped}{extra}]"


class PairedRule:
    default_metric: Metric = "outcome"
    uses_p_value = True

    def verdict(self, s: PairedStats, policy: GatePolicy, p_adjusted: float) -> tuple[bool, str]:
        if s.n == 0:
            return False, f"rejected: no usable pairs (dropped {s.n_dropped})"
        level = round(100 * (1 - policy.alpha))
        ci_ok = s.ci_low_bound > policy.min_delta
        p_ok = p_adjusted <= policy.alpha
        low = f"{s.ci_low_bound:.3f}" + (" (worst-case completion)" if s.n_unevaluated else "")
        ci_text = (
            f"{level}% lower bound of mean diff {low} (bounds [{s.ci_low:.3f}, {s.ci_high:.3f}], "
            f"mean {s.mean_diff:+.3f}) {'clears' if ci_ok else 'does not clear'} min_delta {policy.min_delta:.3f}"
        )
        holm_text = f" (Holm {p_adjusted:.3g})" if p_adjusted != s.p_bound else ""
        p_text = f"sign test p={s.p_bound:.3g}{holm_text} {'<=' if p_ok else '>'} {policy.alpha:g}"
        accepted = ci_ok and p_ok
        return accepted, f"{'accepted' if accepted else 'rejected'}: {ci_text}; {p_text}{_tail(s)}"

    def accept_probability(self, diffs: np.ndarray, remaining: int, policy: GatePolicy) -> float:
        w, l, t = _counts(diffs)
        z = float(stats.norm.ppf(1 - policy.alpha))
        # Both conditions must hold, so the smaller probability is an upper bound on accepting.
        return min(
            predictive_sign_pass(w, l, t, remaining, policy.alpha),
            predictive_mean_clears(diffs, remaining, z, policy.min_delta),
        )


class SoftRule(PairedRule):
    default_metric: Metric = "partial"


class StrictRule:
    default_metric: Metric = "outcome"
    uses_p_value = False

    def verdict(self, s: PairedStats, policy: GatePolicy, p_adjusted: float) -> tuple[bool, str]:
        if s.n == 0:
            return False, f"rejected: no usable pairs (dropped {s.n_dropped})"
        ok = s.mean_diff_bound > policy.min_delta
        rel = ">" if ok else "<="
        return ok, (
            f"{'accepted' if ok else 'rejected'}: candidate mean {s.candidate_mean:.3f} vs incumbent "
            f"{s.incumbent_mean:.3f}, diff {s.mean_diff_bound:+.3f} {rel} min_delta {policy.min_delta:.3f} "
            f"(strict: no significance test){_tail(s)}"
        )

    def accept_probability(self, diffs: np.ndarray, remaining: int, policy: GatePolicy) -> float:
        return predictive_mean_clears(diffs, remaining, 0.0, policy.min_delta)


GATE_POLICIES.add("paired", PairedRule())
GATE_POLICIES.add("strict", StrictRule())
GATE_POLICIES.add("soft", SoftRule())


def decide(evidence: Evidence, policy: GatePolicy | None = None, *, p_adjust: float | None = None) -> Decision:
    """The verdict on `evidence` under `policy`: pure and deterministic (seeded bootstrap).

    `p_adjust` is this candidate's Holm-adjusted p-value when several candidates are compared
    in one round (see `decide_round`); None means the raw sign-test p-value is used.
    """
    policy = policy or GatePolicy()
    rule = GATE_POLICIES.get(policy.name)
    s = paired_stats(evidence, policy)
    p_adj = s.p_bound if p_adjust is None else float(p_adjust)
    accepted, reason = rule.verdict(s, policy, p_adj)
    return Decision(
        accepted=accepted, reason=reason, statistic=s.as_dict(p_adj), policy=policy.name, rollouts=evidence.rollouts
    )


def decide_round(evidences: Sequence[Evidence], policy: GatePolicy | None = None) -> list[Decision]:
    """Decide every candidate of one round, Holm-adjusting their sign-test p-values together."""
    policy = policy or GatePolicy()
    rule = GATE_POLICIES.get(policy.name)
    if not rule.uses_p_value:
        return [decide(e, policy) for e in evidences]
    raw = [paired_stats(e, policy).p_bound for e in evidences]
    return [decide(e, policy, p_adjust=a) for e, a in zip(evidences, holm(raw))]


# --------------------------------------------------------------------------- sequential compare


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


def _accepts(evidence: Evidence, policy: GatePolicy) -> bool:
    """decide(evidence, policy).accepted, without the reporting-only work."""
    s = paired_stats(evidence, policy, report=False)
    return GATE_POLICIES.get(policy.name).verdict(s, policy, s.p_bound)[0]


def _look(evidence: Evidence, policy: GatePolicy, remaining: int, screen: bool) -> tuple[str, str, float | None]:
    """(action, rule, predictive P(accept)) after a stage; see the module docstring, steps 1-3."""
    if _accepts(evidence, policy):
        why = "full evaluation accepts" if not remaining else f"curtailment: accepts even if all {remaining} remaining tasks are losses"
        return "accept", why, None
    if not remaining:
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
) -> tuple[Evidence, Decision]:
    """Score incumbent and candidate on the same tasks and seeds, in stages, and decide.

    `tasks`: Task models, mappings or ids (a split marker is read from `.split` or
    `metadata["split"]`). The first `policy.max_tasks` are planned; they are evaluated in an
    order shuffled by `policy.seed` so early stages are a random sample, not the first family.
    `sequential=False` evaluates every planned task (the reference the bench compares with).
    """
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
        action, why, p_acc = _look(evidence, policy, len(order) - done, screen=(k == 0 and sequential))
        d = np.array(list(task_diffs(evidence, policy.resolved_metric())[0].values()), dtype=float)
        w, l, t = _counts(d)
        name = "full" if not sequential else ("screen" if k == 0 else f"chunk {k}")
        stage = StageRecord(name=name, tasks=size, tasks_total=done, rollouts=spent, wins=w, losses=l, ties=t,
                            p_value=sign_test_p(w, l), p_accept=p_acc, action=action, rule=why)
        evidence = evidence.model_copy(update={"stages": evidence.stages + [stage]})
        if action != "continue":
            break
    decision = decide(evidence, policy)
    if sequential:
        last = evidence.stages[-1]
        decision = decision.model_copy(update={"reason": f"{decision.reason}; stopped at {last.name} after "
                                               f"{last.tasks_total}/{len(planned)} tasks: {last.rule}"})
    return evidence, decision
