"""The validation gate: does a candidate (harness / skill / rubric revision) beat the incumbent?

Both arms are scored by the same checkpoint on the same validation tasks and seeds, so the
evidence is a list of *paired* outcomes. `decide(evidence, policy)` is a pure function from
those pairs to a verdict with its reason; `decide_family` decides the candidates of one round
together (Holm); `coevo.sequential.compare` gathers the pairs in stages and stops as soon as
the verdict is settled.

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

Unevaluated planned tasks (a sequential stop) are filled with the worst case (-1) by every
statistic that decides (`*_bound`), so a Decision is reproducible from its Evidence alone.

Family decisions (`decide_family`). The m candidates of a round are one family: Holm's
step-down on their sign-test p-values (worst-case completion), m fixed before any comparison
runs (a candidate the round budget left untested counts with p = 1). The sequential stops are
made at the level Holm will apply (coevo/sequential.py): a comparison curtails for acceptance
only at alpha / m, the strictest Holm level, and since every smaller p then also lies below
alpha / m, Holm accepts it whatever the others do; a comparison that stopped by rejecting stays
rejected. So the sequential procedure never accepts what the family-wise test would not, and
its family-wise false-accept rate is at most Holm's (<= alpha). The stage record a decision's
reason cites is the last of `Evidence.stages` (stored with the decision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from scipy import stats

from coevo.errors import CoevoError
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
    # accept / reject: settled for the family (curtailment, screen, futility, or the full
    # evaluation); holm: every planned task is in and the round's Holm step-down decides.
    action: Literal["continue", "accept", "reject", "holm"]
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
    # A person has the last word: a candidate the gate accepts is held "pending" until it is
    # approved or vetoed (coevo proposals approve|veto, coevo serve --review); the loop
    # applies the reviews at the next round start (coevo/reviewstep.py).
    human_review: bool = False
    # Power (coevo/gateplan.py, `coevo run --dry-run`): with target_effect the run sizes
    # splits.val_n so that a mean paired difference of this size is accepted with probability
    # target_power (at the round's Holm level); discordance: the share of paired episodes
    # whose outcomes differ (None: observed in the store, else assumed).
    target_effect: float | None = Field(None, gt=0.0, le=1.0)
    target_power: float = Field(0.8, gt=0.0, lt=1.0)
    discordance: float | None = Field(None, gt=0.0, le=1.0)

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
    metric: str = ""  # the per-task metric decided on: outcome | partial ("" for no gate run)
    stages: list[StageRecord] = Field(default_factory=list)  # the last one is what the reason cites


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
    in one round (see `decide_family`); None means the raw sign-test p-value is used. When the
    evidence was gathered in stages, the reason ends with the stage it stopped at."""
    policy = policy or GatePolicy()
    rule = GATE_POLICIES.get(policy.name)
    s = paired_stats(evidence, policy)
    p_adj = s.p_bound if p_adjust is None else float(p_adjust)
    accepted, reason = rule.verdict(s, policy, p_adj)
    statistic = s.as_dict(p_adj)
    last = evidence.stages[-1] if evidence.stages else None
    if last is not None and last.name != "full":
        reason += (f"; stopped at {last.name} after {last.tasks_total}/{len(evidence.planned)} "
                   f"tasks: {last.rule}")
        statistic["stop_stage"] = float(len(evidence.stages) - 1)
    return Decision(accepted=accepted, reason=reason, statistic=statistic, policy=policy.name,
                    rollouts=evidence.rollouts, metric=policy.resolved_metric(),
                    stages=list(evidence.stages))


def decide_family(evidences: Sequence[Evidence], policy: GatePolicy | None = None,
                  family_size: int | None = None) -> list[Decision]:
    """Decide the candidates of one round together: Holm over `family_size` hypotheses (default
    len(evidences); the ones not in `evidences` were not tested and count with p = 1), and a
    comparison whose last stage rejected stays rejected (module docstring)."""
    policy = policy or GatePolicy()
    m = len(evidences) if family_size is None else family_size
    if m < len(evidences):
        raise GateError(f"family_size {m} < {len(evidences)} compared candidates")
    rule = GATE_POLICIES.get(policy.name)
    if rule.uses_p_value:
        raw = [paired_stats(e, policy).p_bound for e in evidences] + [1.0] * (m - len(evidences))
        out = [decide(e, policy, p_adjust=a) for e, a in zip(evidences, holm(raw))]
    else:
        out = [decide(e, policy) for e in evidences]
    for i, (e, d) in enumerate(zip(evidences, out)):
        stop = e.stages[-1] if e.stages else None
        if d.accepted and stop is not None and stop.action == "reject":
            d = d.model_copy(update={"accepted": False, "reason": "rejected: the comparison "
                                     f"stopped by rejecting; {d.reason.split(': ', 1)[-1]}"})
        if family_size is not None or m > 1:
            d = d.model_copy(update={"reason": f"{d.reason} (Holm over {m} candidate(s))"})
        out[i] = d
    return out


def decide_round(evidences: Sequence[Evidence], policy: GatePolicy | None = None) -> list[Decision]:
    """`decide_family` over exactly the given candidates (kept for existing callers)."""
    return decide_family(evidences, policy)
