"""Reach or solve: split the gain between two checkpoints into REACH and SOLVE.

Does a later checkpoint B succeed more than an earlier A because it gets to states A never got
to (REACH), or because it does better from states both get to (SOLVE)? Answered from stored
trajectories alone, no new rollouts.

States. An episode e visits V(e) = {start} + {s_k : k = 1 .. T-1}: `start` is the task's
initial state (every episode of a task begins there, whatever first prompt its harness
rendered, so two arms share it even under different harnesses), and s_k is the state before
turn k: the anchor state of the gigpo estimator (`anchor_key` in coevo/states.py, anchor
"observation"), a hash of the tokens the policy saw since its previous turn (tool results,
user messages), keyed by task, i.e. the same environment state reached by any path.

Definitions, per task t that both arms ran (infrastructure failures are missing data, not
episodes; a task only one arm ran is left out and counted in `left_out`):

    E_X(t)       the ok episodes of arm X in {A, B} on t,   n_X = |E_X(t)|
    S_X(t)       = union of V(e) over e in E_X(t)           the states X reached on t
    y(e)         the episode's `metric` (success by default; outcome or reward), in [0, 1]
    new(e)       e in E_B(t) and V(e) not within S_A(t): B's episode visits a state A never reached
    lost(e)      e in E_A(t) and V(e) not within S_B(t): A's episode visits a state B never reached
    common(e)    neither: the episode stays inside S_A(t) & S_B(t), the states both reached

    GAIN(t)  = sum_{E_B} y / n_B - sum_{E_A} y / n_A                            (= p_B(t) - p_A(t))
    REACH(t) = sum_{new} y / n_B - sum_{lost} y / n_A
    SOLVE(t) = sum_{common in E_B} y / n_B - sum_{common in E_A} y / n_A

GAIN, REACH and SOLVE are the means of these over the tasks both arms ran.

REACH + SOLVE = GAIN, exactly. Proof: each arm's episodes are split into two disjoint parts,
E_B(t) = new + common and E_A(t) = lost + common, so sum_{E_B} y = sum_{new} y + sum_{common
in E_B} y and likewise for A; dividing by n_B (n_A), subtracting, and averaging over tasks
(a linear operation) gives GAIN = REACH + SOLVE. (tests/test_reach.py checks it on stores.)

Reading it. REACH is the success B earns through states A never reached, minus the success A
earned through states B no longer reaches; SOLVE is the change in success earned from the
states both reached (as a share of all episodes, so the two add up; `rows` also give each arm's
share of episodes that left the shared states). Single-turn episodes visit `start` only:
REACH is 0 and the whole gain is SOLVE. State sets grow with the episodes drawn: compare arms
with equal samples per task (the counts are reported).

Which trajectories are a checkpoint's: those recorded with that checkpoint id (`base`: none,
the base model). RL rollouts are recorded with the newest checkpoint their policy descends
from; with `exact` (default) only those sampled by exactly its weights are kept (policy_step
absent, as in evaluations, or equal to the checkpoint's step).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from coevo.errors import CoevoError
from coevo.states import anchor_key
from coevo.trajectory import Trajectory

Metric = Literal["success", "outcome", "reward"]
BASE = "base"  # the checkpoint reference of the base model (trajectories without a checkpoint)
START = "start"


class TaskSplit(BaseModel):
    """One task's decomposition; counts are episodes unless named states."""

    model_config = ConfigDict(extra="forbid")
    task_id: str
    n_a: int
    n_b: int
    states_a: int
    states_b: int
    states_shared: int
    new_b: int  # B's episodes through a state A never reached
    lost_a: int  # A's episodes through a state B never reached
    p_a: float
    p_b: float
    gain: float
    reach: float
    solve: float


class ReachSolve(BaseModel):
    """The decomposition of B's gain over A (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    a: str
    b: str
    metric: Metric
    tasks: int  # tasks both arms ran
    left_out: int  # tasks only one arm ran
    episodes_a: int
    episodes_b: int
    p_a: float | None
    p_b: float | None
    gain: float | None
    reach: float | None
    solve: float | None
    new_fraction_b: float | None  # share of B's episodes through states A never reached
    lost_fraction_a: float | None  # share of A's episodes through states B never reached
    rows: list[TaskSplit]


def episode_states(traj: Trajectory) -> set[str]:
    """V(e): `start` plus the anchor state before every later turn."""
    return {START} | {anchor_key(traj, k, "observation")[1] for k in range(1, len(traj.turns))}


def metric_of(traj: Trajectory, metric: Metric) -> float:
    if metric == "success":
        return float(traj.success)
    value = traj.outcome if metric == "outcome" else traj.reward
    return float(value) if value is not None else 0.0


def _scored(trajs: Iterable[Trajectory], metric: Metric) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        if t.infra_failed or (metric == "outcome" and t.outcome is None) or (
                metric == "reward" and t.reward is None):
            continue  # missing data, never a zero
        out[t.task_id].append(t)
    return out


def split_task(task_id: str, a: Sequence[Trajectory], b: Sequence[Trajectory],
               metric: Metric = "success") -> TaskSplit:
    """REACH / SOLVE / GAIN of one task from both arms' episodes on it."""
    va, vb = [episode_states(t) for t in a], [episode_states(t) for t in b]
    sa, sb = set().union(*va), set().union(*vb)
    ya, yb = [metric_of(t, metric) for t in a], [metric_of(t, metric) for t in b]
    new = [not v <= sa for v in vb]
    lost = [not v <= sb for v in va]
    na, nb = len(a), len(b)
    reach = sum(y for y, x in zip(yb, new) if x) / nb - sum(y for y, x in zip(ya, lost) if x) / na
    solve = (sum(y for y, x in zip(yb, new) if not x) / nb
             - sum(y for y, x in zip(ya, lost) if not x) / na)
    p_a, p_b = sum(ya) / na, sum(yb) / nb
    return TaskSplit(task_id=task_id, n_a=na, n_b=nb, states_a=len(sa), states_b=len(sb),
                     states_shared=len(sa & sb), new_b=sum(new), lost_a=sum(lost), p_a=p_a,
                     p_b=p_b, gain=p_b - p_a, reach=reach, solve=solve)


def reach_or_solve(a: Iterable[Trajectory], b: Iterable[Trajectory], metric: Metric = "success",
                   a_label: str = "A", b_label: str = "B") -> ReachSolve:
    """Decompose B's gain over A on the tasks both ran (see the module docstring)."""
    if metric not in ("success", "outcome", "reward"):
        raise CoevoError(f"metric: {metric!r} is not one of success, outcome, reward")
    by_a, by_b = _scored(a, metric), _scored(b, metric)
    both = sorted(set(by_a) & set(by_b))
    rows = [split_task(t, by_a[t], by_b[t], metric) for t in both]
    n = len(rows)
    mean = (lambda key: sum(getattr(r, key) for r in rows) / n) if n else (lambda key: None)
    ea, eb = sum(r.n_a for r in rows), sum(r.n_b for r in rows)
    return ReachSolve(
        a=a_label, b=b_label, metric=metric, tasks=n, left_out=len(set(by_a) ^ set(by_b)),
        episodes_a=ea, episodes_b=eb, p_a=mean("p_a"), p_b=mean("p_b"), gain=mean("gain"),
        reach=mean("reach"), solve=mean("solve"),
        new_fraction_b=sum(r.new_b for r in rows) / eb if eb else None,
        lost_fraction_a=sum(r.lost_a for r in rows) / ea if ea else None, rows=rows)


# --- from the store ---------------------------------------------------------------------------


def checkpoint_trajectories(store: Any, ref: str, env: str, *, run: str | None = None,
                            split: str | None = None, exact: bool = True
                            ) -> tuple[str, list[Trajectory]]:
    """(the checkpoint's id, or `base`; its stored trajectories on `env`). `ref` is a
    checkpoint id or sha256, or `base` (no checkpoint: the base model, best with `run`)."""
    if ref == BASE:
        cid, step = BASE, 0
        trajs = store.trajectories(run=run, env=env, split=split, checkpoint="")
    else:
        ck = store.get_checkpoint(ref)
        cid, step = ck.id, ck.step
        trajs = store.trajectories(run=run, env=env, split=split, checkpoint=ck.id)
    if exact:
        trajs = [t for t in trajs if t.policy_step is None or t.policy_step == step]
    return cid, trajs


def compare_checkpoints(store: Any, a: str, b: str, env: str, *, run: str | None = None,
                        split: str | None = None, metric: Metric = "success",
                        exact: bool = True) -> ReachSolve:
    """REACH / SOLVE of checkpoint `b` over `a` on `env`, from the store's trajectories."""
    a_id, ta = checkpoint_trajectories(store, a, env, run=run, split=split, exact=exact)
    b_id, tb = checkpoint_trajectories(store, b, env, run=run, split=split, exact=exact)
    for ref, ts in ((a, ta), (b, tb)):
        if not ts:
            where = f" of run {run!r}" if run else ""
            raise CoevoError(f"checkpoint {ref}: no stored trajectories on env {env!r}{where}"
                             f"{f' in split {split!r}' if split else ''}"
                             f"{' sampled by exactly its weights (--any-step widens)' if exact else ''}")
    return reach_or_solve(ta, tb, metric, a_id, b_id)


def run_val_pairs(store: Any, run: str, metric: Metric = "outcome") -> list[ReachSolve]:
    """The decomposition between consecutive val-curve evaluations of a run (the seed's at the
    start of round 0, then each round's end: the incumbent's checkpoint and assets), labelled
    `round R start` / `round R` with the checkpoint (`base`: none). Rounds without a stored
    val evaluation are skipped."""
    points: list[tuple[str, str]] = []
    for rnd in store.rounds(run):
        evs = rnd.summary.get("evaluations") or {}
        for key, label in (("val_start", f"round {rnd.index} start"), ("val", f"round {rnd.index}")):
            if isinstance(evs, dict) and isinstance(evs.get(key), str):
                ck = store.get_evaluation(evs[key]).checkpoint
                points.append((f"{label} ({ck[:12] if ck else BASE})", evs[key]))
    out = []
    for (la, ea), (lb, eb) in zip(points, points[1:]):
        out.append(reach_or_solve(store.trajectories(evaluation=ea),
                                  store.trajectories(evaluation=eb), metric, la, lb))
    return out
