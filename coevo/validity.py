"""The predictive-validity gate for rubric candidates (ARISE's rubric evolution, made testable).

A rubric candidate is NEVER gated on its own scores: a policy trained against a rubric can always
score higher on it (FACTS.md: a rubric paying for "the output decodes" reached 100% decodes
within 20 GRPO steps by copying the worked example, with 0 right function names). It is gated
on *predictive validity*: on stored validation trajectories with verified outcomes
(`Trajectory.outcome`, the environment verifier's), the candidate's partial-credit score must
predict the outcome better than the incumbent rubric's, and must not pay failed trajectories
more than passed ones.

Partial-credit score of a rubric on a trajectory: the weighted mean of its criteria that could
be scored, LEAVING OUT criteria of kind "outcome" without a `detail` param (those are the
verified outcome itself: including them would predict the label with the label). Criteria that
cannot be scored are missing, as in `coevo.rewards` (an `llm_judge` with no judge given, a
detail the environment does not report); a trajectory where none could be scored has no
partial score (None) and is dropped from both arms.

Rescoring a stored trajectory under another rubric rebuilds what `coevo.rewards.score_rubric`
needs: the Task (`env.tasks(trajectory.split)` by id), the Response (as
`coevo.agent.graph.finish_node` builds it: answer text, last turn's calls, every turn's calls,
last turn's parse error) and the env Score (`env.score(task, state, response)`). For a
single-turn environment `state = env.start(task)`; for a multi-turn one the state is rebuilt by
replaying the episode against a fresh `env.start(task)`: each turn whose calls were executed
(its `tool_results` are recorded) sends its environment-function calls to `env.step`, a turn
that attempted no call advances `env.next_turn`, and in a text game (`env.act`) the reply of
every other turn is played again, as the agent graph does. The label is the
STORED outcome, never the rescored one: rescoring only recovers partial-credit details.

Statistic: AUC of partial score vs (outcome >= 0.5) for each rubric on the same trajectories
(Mann-Whitney U / (n_pass * n_fail), ties count 0.5), and a paired percentile bootstrap over
trajectories (one fixed resampling matrix, both AUCs recomputed per resample) for the difference
AUC(candidate) - AUC(incumbent). Accept iff
  1. at least `min_each` passed AND `min_each` failed trajectories are usable,
  2. the one-sided (1 - alpha) lower bound of the AUC difference exceeds `min_delta`,
  3. the candidate's mean partial score on failed trajectories is not above its mean on passed,
  4. the reward as the trainer will use it (`coevo.rewards.reward`: outcome_weight x verified
     outcome + partial credit, the outcome criteria included) orders passed above failed
     trajectories at least as well as the incumbent's (AUC of the whole reward, candidate >=
     incumbent). Conditions 1-3 look at the partial credit alone, which cannot see a candidate
     that drops the outcome from the reward (outcome_weight 0, no outcome criteria): its
     partial credit may predict the outcome well while the policy would no longer be paid for
     it. Such a candidate is refused earlier too (`check_candidate`: a rubric may not lower the
     outcome's share of the reward); this condition is the gate's own check.
Spearman's rank correlation of each rubric's partial score with the outcome is reported as a
secondary number; it does not decide.

Departures: ARISE scores rubric usefulness by downstream reward; here validity is measured
offline on stored trajectories, so a rubric decision spends no rollouts (`rollouts=0`). The
bootstrap resamples trajectories, not tasks: several samples of one task are treated as
independent, which narrows the interval when val samples > 1 (the gate's tasks are usually
one sample each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats

from coevo.envs.base import Response, Score, Task
from coevo.errors import CoevoError, InfraError
from coevo.gate import Decision
from coevo.rewards import reward, score_rubric
from coevo.trajectory import Trajectory


class ValidityPolicy(BaseModel):
    """Settings of the validity gate (see the module docstring for the rule)."""

    model_config = ConfigDict(extra="forbid")
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    min_delta: float = Field(0.0, ge=-1.0, lt=1.0)
    n_boot: int = Field(2000, ge=100)
    min_each: int = Field(5, ge=1)  # passed and failed trajectories needed, each
    seed: int = 0


# --------------------------------------------------------------------------- rescoring


Rebuilt = tuple[Task, Response, Score]


def label_leaks(criterion: Any) -> bool:
    """An "outcome" criterion without a detail is the verified outcome itself."""
    return criterion.kind == "outcome" and criterion.params.detail is None


def partial_rubric(rubric: Any, *, judge: Any = None) -> Any | None:
    """`rubric` restricted to the criteria its partial score uses (None: none left).

    Leaves out label-leaking outcome criteria and, without a judge, llm_judge criteria (they
    would be missing anyway; score_rubric refuses them without a judge)."""
    kept = [c for c in rubric.criteria
            if not label_leaks(c) and not (c.kind == "llm_judge" and judge is None)]
    if not kept or sum(c.weight for c in kept) <= 0:
        return None
    # model_copy skips validation: the subset of a valid rubric's criteria is valid by itself.
    return rubric.model_copy(update={"criteria": kept})


def response_of(t: Trajectory) -> Response:
    """The Response the verifier saw (mirrors coevo.agent.graph.finish_node)."""
    last = t.turns[-1] if t.turns else None
    return Response(
        text=t.answer or "", tool_calls=list(last.tool_calls) if last else [],
        all_tool_calls=[list(x.tool_calls) for x in t.turns],
        parse_error=last.parse_error if last else None)


def _env_functions(state: Any, task: Task) -> set[str]:
    specs = getattr(state, "tools", None) or task.tools
    return {str((s.get("function") if isinstance(s.get("function"), dict) else s).get("name", ""))
            for s in specs}


def replay_state(env: Any, task: Task, t: Trajectory) -> Any:
    """A fresh `env.start(task)`, advanced through the episode's recorded turns (multi-turn)."""
    state = env.start(task)
    if getattr(env, "single_turn", True):
        return state
    next_turn = getattr(env, "next_turn", None)
    act = getattr(env, "act", None)
    for i, turn in enumerate(t.turns):
        if turn.tool_results:  # these calls were executed in the episode
            names = _env_functions(state, task)
            calls = [c for c in turn.tool_calls if c.name in names]
            if calls:
                env.step(state, calls)
        elif act is not None:
            act(state, turn.text)  # a text game: the reply was played as a move
        elif not turn.tool_calls and turn.parse_error is None and i + 1 < len(t.turns) \
                and next_turn is not None:
            next_turn(state)  # the agent answered without a call: the next user turn came
    return state


class _TaskIndex:
    """Task by (split, id), from `env.tasks(split)`; a trajectory of an unknown task is a
    configuration error (the wrong environment), not missing data."""

    def __init__(self, env: Any):
        self.env, self._by_split = env, {}

    def get(self, t: Trajectory) -> Task:
        if t.split not in self._by_split:
            self._by_split[t.split] = {x.id: x for x in self.env.tasks(t.split)}
        task = self._by_split[t.split].get(t.task_id)
        if task is None:
            raise CoevoError(f"validity: trajectory {t.id}: task {t.task_id!r} is not in "
                             f"{getattr(self.env, 'name', 'the environment')}'s {t.split!r} split")
        return task


def usable(t: Trajectory) -> bool:
    return not t.infra_failed and t.outcome is not None


def rebuild(trajectories: Sequence[Trajectory], env: Any) -> list[Rebuilt | None]:
    """(task, response, env score) per trajectory; None for infra-failed / unverified ones
    and when the verifier itself cannot run (InfraError: missing data)."""
    tasks = _TaskIndex(env)
    out: list[Rebuilt | None] = []
    for t in trajectories:
        if not usable(t):
            out.append(None)
            continue
        task = tasks.get(t)
        response = response_of(t)
        try:
            score = env.score(task, replay_state(env, task, t), response)
        except InfraError:
            out.append(None)
            continue
        out.append((task, response, score))
    return out


def _scored(rubric: Any, trajectories: Sequence[Trajectory], rebuilt: Sequence[Rebuilt | None],
            judge: Any) -> list[tuple[Trajectory, dict[str, float]] | None]:
    """Each usable trajectory with its criteria scores under `rubric` (None: not rebuilt)."""
    out: list[tuple[Trajectory, dict[str, float]] | None] = []
    for t, r in zip(trajectories, rebuilt):
        if r is None or not rubric.criteria:
            out.append(None if r is None else (t, {}))
            continue
        task, response, score = r
        out.append((t, score_rubric(rubric, task, response, score, judge=judge, trajectory=t)))
    return out


def _partials(rubric: Any, trajectories: Sequence[Trajectory], rebuilt: Sequence[Rebuilt | None],
              judge: Any) -> list[float | None]:
    sub = partial_rubric(rubric, judge=judge)
    if sub is None:
        return [None] * len(trajectories)
    weights = {c.id: c.weight for c in sub.criteria}
    out: list[float | None] = []
    for x in _scored(sub, trajectories, rebuilt, judge):
        total = sum(weights[k] for k in x[1]) if x is not None else 0.0
        out.append(sum(weights[k] * v for k, v in x[1].items()) / total if total > 0 else None)  # type: ignore[index]
    return out


def _rewards(rubric: Any, trajectories: Sequence[Trajectory], rebuilt: Sequence[Rebuilt | None],
             judge: Any) -> list[float | None]:
    """The reward the trainer computes from `rubric` (outcome included), per trajectory: the
    stored verified outcome weighted by outcome_weight plus the partial credit of every
    criterion that could be scored (llm_judge ones only with a judge)."""
    kept = [c for c in rubric.criteria if not (c.kind == "llm_judge" and judge is None)]
    sub = rubric.model_copy(update={"criteria": kept})
    return [None if x is None else reward(sub, x[0].outcome, x[1])
            for x in _scored(sub, trajectories, rebuilt, judge)]


def rescore(rubric: Any, trajectories: Sequence[Trajectory], env: Any, *,
            judge: Any = None) -> list[float | None]:
    """The rubric's partial-credit score on each stored trajectory (None: no criterion could
    be scored, or the trajectory is infra-failed / has no verified outcome)."""
    trajectories = list(trajectories)
    return _partials(rubric, trajectories, rebuild(trajectories, env), judge)


# --------------------------------------------------------------------------- statistics


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """P(score of a passed > score of a failed), ties counting 0.5 (Mann-Whitney U / n1 n0).

    >>> auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False])
    1.0
    >>> auc([0.5, 0.5, 0.5], [True, False, False])
    0.5
    """
    return float(_auc_rows(np.asarray(scores, dtype=float)[None, :],
                           np.asarray(labels, dtype=bool)[None, :])[0])


def _auc_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise AUC; x, y (m, n); NaN where a row has no passed or no failed entry."""
    ranks = stats.rankdata(x, axis=1)  # average ranks: a tie contributes 0.5
    n1 = y.sum(axis=1)
    n0 = y.shape[1] - n1
    u = (ranks * y).sum(axis=1) - n1 * (n1 + 1) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), u / (n1 * n0), np.nan)


def auc_diff_bounds(inc: np.ndarray, cand: np.ndarray, y: np.ndarray,
                    policy: ValidityPolicy) -> tuple[float, float]:
    """One-sided (1 - alpha) lower and upper paired-bootstrap bounds of AUC(cand) - AUC(inc)."""
    n = len(y)
    idx = np.random.default_rng(policy.seed).integers(0, n, size=(policy.n_boot, n))  # (B, n)
    d = _auc_rows(cand[idx], y[idx]) - _auc_rows(inc[idx], y[idx])  # (B,)
    d = d[~np.isnan(d)]  # resamples that drew one class only have no AUC
    if not len(d):
        return (float("nan"), float("nan"))
    lo, hi = np.quantile(d, [policy.alpha, 1.0 - policy.alpha])
    return (float(lo), float(hi))


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")  # undefined for a constant variable
    return float(stats.spearmanr(x, y).statistic)


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.3f}"


# --------------------------------------------------------------------------- the decision


def validity_decision(incumbent: Any, candidate: Any, trajectories: Sequence[Trajectory], env: Any,
                      policy: ValidityPolicy | None = None, *,
                      judge: Any = None) -> tuple[Decision, list[dict[str, Any]]]:
    """Gate a rubric candidate on predictive validity (module docstring). Returns the
    Decision (policy "validity", rollouts 0) and one evidence row per trajectory in the store's
    shape {task_id, sample, incumbent, candidate, status}: the two partial scores, status "ok"
    when the trajectory was used and "infra_error" (the store's only missing-data status) when
    it was dropped (infra failure, no verified outcome, or a rubric could not score it)."""
    policy = policy or ValidityPolicy()
    trajs = sorted(trajectories, key=lambda t: (t.task_id, t.sample_index, t.id))  # order-free
    rebuilt = rebuild(trajs, env)
    inc_s = _partials(incumbent, trajs, rebuilt, judge)
    cand_s = _partials(candidate, trajs, rebuilt, judge)
    inc_r = _rewards(incumbent, trajs, rebuilt, judge)
    cand_r = _rewards(candidate, trajs, rebuilt, judge)
    rows, keep = [], []
    for i, (t, a, b) in enumerate(zip(trajs, inc_s, cand_s)):
        ok = usable(t) and a is not None and b is not None
        rows.append({"task_id": t.task_id, "sample": t.sample_index, "incumbent": a,
                     "candidate": b, "status": "ok" if ok else "infra_error"})
        if ok:
            keep.append(i)
    y = np.array([trajs[i].outcome >= 0.5 for i in keep], dtype=bool)  # type: ignore[operator]
    inc = np.array([inc_s[i] for i in keep], dtype=float)
    cand = np.array([cand_s[i] for i in keep], dtype=float)
    inc_rw = np.array([inc_r[i] for i in keep], dtype=float)
    cand_rw = np.array([cand_r[i] for i in keep], dtype=float)
    n, n_pass = len(y), int(y.sum())
    n_fail = n - n_pass
    st: dict[str, float] = {"n": float(n), "n_passed": float(n_pass), "n_failed": float(n_fail),
                            "n_dropped": float(len(trajs) - n)}
    head = f"n={n} (passed {n_pass}, failed {n_fail}, dropped {len(trajs) - n})"
    if n_pass < policy.min_each or n_fail < policy.min_each:
        return Decision(accepted=False, policy="validity", rollouts=0, statistic=st, reason=(
            f"rejected: not enough verified outcomes: {n_pass} passed, {n_fail} failed "
            f"(need {policy.min_each} of each); {head}")), rows
    auc_i, auc_c = auc(inc, y), auc(cand, y)
    lo, hi = auc_diff_bounds(inc, cand, y, policy)
    fail_mean, pass_mean = float(cand[~y].mean()), float(cand[y].mean())
    rho_i, rho_c = spearman(inc, y.astype(float)), spearman(cand, y.astype(float))
    rw_i, rw_c = auc(inc_rw, y), auc(cand_rw, y)
    st.update({"auc_incumbent": auc_i, "auc_candidate": auc_c, "auc_diff": auc_c - auc_i,
               "ci_low": lo, "ci_high": hi, "candidate_failed_mean": fail_mean,
               "candidate_passed_mean": pass_mean,
               "incumbent_failed_mean": float(inc[~y].mean()),
               "incumbent_passed_mean": float(inc[y].mean()),
               "spearman_incumbent": rho_i, "spearman_candidate": rho_c,
               "auc_reward_incumbent": rw_i, "auc_reward_candidate": rw_c,
               "alpha": policy.alpha, "min_delta": policy.min_delta})
    # Non-finite numbers cannot be stored as JSON on every database: left out, "n/a" in text.
    st = {k: float(v) for k, v in st.items() if np.isfinite(v)}
    level = round(100 * (1 - policy.alpha))
    auc_ok = np.isfinite(lo) and lo > policy.min_delta
    order_ok = fail_mean <= pass_mean
    reward_ok = rw_c >= rw_i
    accepted = bool(auc_ok and order_ok and reward_ok)
    reason = (
        f"{'accepted' if accepted else 'rejected'}: AUC candidate {auc_c:.3f} vs incumbent "
        f"{auc_i:.3f} (diff {auc_c - auc_i:+.3f}); {level}% lower bound of the AUC diff "
        f"{_fmt(lo)} (bounds [{_fmt(lo)}, {_fmt(hi)}]) "
        f"{'clears' if auc_ok else 'does not clear'} min_delta {policy.min_delta:.3f}; "
        f"candidate mean partial on failed {fail_mean:.3f} "
        f"{'<=' if order_ok else '>'} on passed {pass_mean:.3f}"
        f"{'' if order_ok else ' (rewards failures more)'}; "
        f"the trainer's reward (outcome included) AUC candidate {rw_c:.3f} "
        f"{'>=' if reward_ok else '<'} incumbent {rw_i:.3f}"
        f"{'' if reward_ok else ' (orders outcomes worse: the outcome would not dominate)'}; "
        f"spearman candidate {_fmt(rho_c)}, incumbent {_fmt(rho_i)}; {head}")
    return Decision(accepted=accepted, reason=reason, statistic=st, policy="validity",
                    rollouts=0), rows
