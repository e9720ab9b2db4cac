"""Evaluate fixed (assets, checkpoint) on a split: run the episodes, store them, summarise.

`evaluate(...)` runs `samples` episodes of every task through an executor, stores every
trajectory and one result row per episode under a new evaluation, and returns `EvalResult`.
This is what `coevo eval` shows and what the gate and the final test evaluation call.

Statistics. The unit of independence is the task (its samples share a prompt), so the mean
score and its 95% interval are over per-task means: a Student-t interval, mean +- t(0.975,
n-1) * sd / sqrt(n), clipped to [0, 1] (outcomes live there; clipping only matters for tiny or
degenerate samples). A t interval rather than a bootstrap keeps the summary deterministic;
gate.py does the resampling where a decision depends on it. Success rate and mean reward are
per-task means averaged the same way; partial credit per criterion, turns and tokens are means
over scored episodes.

Infrastructure failures (backend error, verifier crash, lost worker) are missing data: their
rows are stored with outcome None and status "infra_error", they are excluded from every mean
and counted in `n_infra_failures`, and a task whose every sample failed is left out of the
per-task means (and counted in `n_tasks_missing`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coevo.envs.base import SPLITS, Environment, Task
from coevo.errors import CoevoError
from coevo.executors import AgentAssets, EpisodeJob, Executor, LocalExecutor, resolve_env
from coevo.models.base import Backend
from coevo.trajectory import Trajectory


class TaskResult(BaseModel):
    """One task's samples, aggregated (None: every sample was an infrastructure failure)."""

    model_config = ConfigDict(extra="forbid")
    task_id: str
    samples: int
    scored: int
    outcome: float | None
    success_rate: float | None
    reward: float | None


class EvalResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    evaluation: str | None = None  # the store's evaluation id (None: not stored)
    env: str
    split: str
    harness: str | None = None
    skill_library: str | None = None
    rubric: str | None = None
    checkpoint: str | None = None
    samples: int
    n_tasks: int
    n_episodes: int
    n_scored: int  # episodes with a score
    n_infra_failures: int  # episodes that are missing data
    n_tasks_missing: int  # tasks with no scored episode
    mean: float | None  # mean over tasks of the per-task mean outcome
    ci_low: float | None  # 95% Student-t interval over per-task means, clipped to [0, 1]
    ci_high: float | None
    success_rate: float | None
    reward_mean: float | None
    criteria: dict[str, float] = Field(default_factory=dict)  # mean partial credit
    mean_turns: float | None
    tokens_sampled: int  # policy tokens (mask 1), all episodes
    tokens_total: int  # every token of every episode (prompts, observations included)
    seconds: float  # wall-clock of the whole evaluation
    tasks: list[TaskResult] = Field(default_factory=list)

    def line(self) -> str:
        """One line for the CLI: mean [low, high], success, failures."""
        if self.mean is None:
            return f"{self.env} {self.split}: no scored episodes ({self.n_infra_failures} infra failures)"
        ci = (f" [{self.ci_low:.3f}, {self.ci_high:.3f}]" if self.ci_low is not None else "")
        return (f"{self.env} {self.split}: mean {self.mean:.3f}{ci} over {self.n_tasks - self.n_tasks_missing}"
                f" tasks x {self.samples}, success {self.success_rate:.3f}, "
                f"{self.n_infra_failures} infra failures")


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided Student-t interval for the mean, clipped to [0, 1]; (None, None) for n < 2.

    >>> t_interval([0.0, 1.0, 1.0, 0.0])
    (0.0, 1.0)
    >>> t_interval([0.5, 0.5, 0.5])
    (0.5, 0.5)
    """
    if len(values) < 2:
        return None, None
    m, half = _t_half(values, level)
    return max(0.0, m - half), min(1.0, m + half)


def _t_half(values: Sequence[float], level: float) -> tuple[float, float]:
    """(mean, half-width of the two-sided Student-t interval) of n >= 2 values."""
    from scipy import stats

    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)


def task_outcomes(rec: Any) -> dict[str, float]:
    """{task id: mean outcome over its scored samples} of a stored evaluation (an
    EvaluationRecord with its results); tasks with no scored sample are left out."""
    by: dict[str, list[float]] = {}
    for r in rec.results:
        if r.outcome is not None:
            by.setdefault(r.task_id, []).append(r.outcome)
    return {t: sum(v) / len(v) for t, v in by.items()}


def paired_difference(after: Mapping[str, float], before: Mapping[str, float],
                      level: float = 0.95) -> tuple[float | None, float | None, float | None, int]:
    """(mean, low, high, n) of `after - before` over the tasks both scored ({task id:
    outcome}, e.g. `task_outcomes`): the per-task differences and their two-sided Student-t
    interval (not clipped).

    >>> m, lo, hi, n = paired_difference({"a": 1, "b": 1, "c": 0, "d": 1, "e": 1},
    ...                                  {"a": 0, "b": 1, "c": 0, "d": 0})
    >>> (m, round(lo, 3), round(hi, 3), n)
    (0.5, -0.419, 1.419, 4)
    """
    d = [v - before[t] for t, v in after.items() if t in before]
    n = len(d)
    if n < 2:
        return (d[0] if d else None), None, None, n
    m, half = _t_half(d, level)
    return m, m - half, m + half, n


def summarize(trajs: Sequence[Trajectory], *, env: str, split: str, samples: int,
              seconds: float = 0.0, evaluation: str | None = None) -> EvalResult:
    """The EvalResult of a list of trajectories (pure: no store, no model)."""
    by_task: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t)
    scored = [t for t in trajs if not t.infra_failed and t.outcome is not None]
    tasks: list[TaskResult] = []
    for tid, ts in by_task.items():
        ok = [t for t in ts if not t.infra_failed and t.outcome is not None]
        rewards = [t.reward for t in ok if t.reward is not None]
        tasks.append(TaskResult(
            task_id=tid, samples=len(ts), scored=len(ok),
            outcome=_mean([t.outcome for t in ok]),
            success_rate=_mean([float(t.success) for t in ok]), reward=_mean(rewards)))
    present = [r for r in tasks if r.outcome is not None]
    means = [r.outcome for r in present]
    low, high = t_interval(means)
    crit: dict[str, list[float]] = {}
    for t in scored:
        for k, v in t.criteria.items():
            crit.setdefault(k, []).append(v)
    first = trajs[0] if trajs else None
    return EvalResult(
        evaluation=evaluation, env=env, split=split,
        harness=first.harness if first else None,
        skill_library=first.skill_library if first else None,
        rubric=first.rubric if first else None, checkpoint=first.checkpoint if first else None,
        samples=samples, n_tasks=len(by_task), n_episodes=len(trajs), n_scored=len(scored),
        n_infra_failures=sum(1 for t in trajs if t.infra_failed or t.outcome is None),
        n_tasks_missing=len(tasks) - len(present), mean=_mean(means), ci_low=low, ci_high=high,
        success_rate=_mean([r.success_rate for r in present]),
        reward_mean=_mean([r.reward for r in present if r.reward is not None]),
        criteria={k: sum(v) / len(v) for k, v in sorted(crit.items())},
        mean_turns=_mean([float(len(t.turns)) for t in scored]),
        tokens_sampled=sum(t.sampled_tokens for t in trajs),
        tokens_total=sum(len(t.token_ids) for t in trajs), seconds=seconds, tasks=tasks)


def _result_row(t: Trajectory) -> dict[str, Any]:
    failed = t.infra_failed or t.outcome is None
    return {"task_id": t.task_id, "sample": t.sample_index,
            "outcome": None if failed else t.outcome, "success": bool(t.success and not failed),
            "reward": None if failed else t.reward, "criteria": {} if failed else t.criteria,
            "status": "infra_error" if failed else "ok", "trajectory": t.id}


def _checkpoint(store: Any, ref: str | None) -> tuple[str | None, str | None]:
    """(checkpoint id, adapter folder) of a stored checkpoint, its file verified."""
    if ref is None:
        return None, None
    from pathlib import Path

    from coevo.rl.lora import ADAPTER_FILE, FULL_FILE, file_sha256

    rec = store.get_checkpoint(ref)
    folder = Path(rec.path)
    weights = next((folder / f for f in (ADAPTER_FILE, FULL_FILE) if (folder / f).is_file()), None)
    if weights is None:
        raise CoevoError(f"checkpoint {rec.id}: {folder}: no {ADAPTER_FILE} (moved or deleted?)")
    if weights.name == FULL_FILE:
        raise CoevoError(f"checkpoint {rec.id}: {folder} is a full fine-tune; evaluate it with "
                         f"an hf:{folder} backend and no checkpoint")
    actual = file_sha256(weights)
    if actual != rec.sha256:
        raise CoevoError(f"checkpoint {rec.id}: {weights}: sha256 {actual[:12]} differs from the "
                         f"stored {rec.sha256[:12]} (the file changed after it was recorded)")
    return rec.id, str(folder)


class _Counter:
    """An executor's on_episode hook reporting (episodes ended, total) to `progress`."""

    def __init__(self, progress: Callable[[int, int], None], total: int):
        self.progress, self.total, self.done = progress, total, 0
        progress(0, total)

    def __call__(self, _: Trajectory) -> None:
        self.done += 1
        self.progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        """Episodes an executor returned without reporting (a lost worker's) count as ended."""
        if self.done < self.total:
            self.done = self.total
            self.progress(self.total, self.total)


def evaluate(store: Any, env: str | Environment, assets: AgentAssets,
             backend: Backend | None = None, *, tasks: Sequence[Task] | None = None,
             split: str = "val", n: int | None = None, samples: int = 1, seed: int = 0,
             checkpoint: str | None = None, run: str | None = None, round: int | None = None,
             executor: Executor | None = None, store_trajectories: bool = True,
             task_seeds: dict[str, list[int]] | None = None, judge: Backend | None = None,
             key: str | None = None,
             on_stored: Callable[[EvalResult], None] | None = None,
             progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Run `samples` episodes of each task (given `tasks`, or `env.tasks(split, n)`), store
    every trajectory and result row under a new evaluation, and return its summary.

    checkpoint: a stored checkpoint (id or sha256); its adapter is loaded on the backend
    (verified against the stored sha256) and recorded. executor: where the episodes run
    (default: this process, on `backend`, with `judge` for llm_judge criteria). run/round: the
    run the evaluation belongs to. task_seeds: every task's own sample seeds instead of `seed`.
    key: an idempotency key: when an evaluation is stored under it, that one is returned
    (nothing runs); otherwise the new one is stored under it. on_stored(result): called inside
    the transaction that stores the evaluation (e.g. to charge its cost, so the charge and the
    rows are written together or not at all). progress(done, total): episodes ended of the
    episodes to run, (0, total) first and (total, total) last (not called when `key` finds a
    stored evaluation: nothing runs).
    """
    if split not in SPLITS:
        raise CoevoError(f"split: {split!r}; expected one of {', '.join(SPLITS)}")
    if samples < 1:
        raise CoevoError(f"samples: must be >= 1, got {samples}")
    if key is not None and (done := store.find_evaluation(key)) is not None:
        rec = store.get_evaluation(done)
        return EvalResult.model_validate({**rec.summary, "evaluation": rec.id})
    if executor is None:
        if backend is None:
            raise CoevoError("evaluate: give a backend or an executor")
        executor = LocalExecutor(backend, judge=judge)
    env_obj = resolve_env(env)
    task_list = list(tasks) if tasks is not None else env_obj.tasks(split, n)
    if not task_list:
        raise CoevoError(f"evaluate: {env_obj.name} has no {split} tasks")
    ckpt_id, adapter = _checkpoint(store, checkpoint)
    hashes = assets.put(store)
    t0 = time.perf_counter()
    job = EpisodeJob(env=env, tasks=task_list, assets=assets, samples=samples, seed=seed,
                     split=split, checkpoint=ckpt_id, adapter=adapter, task_seeds=task_seeds)
    if progress is None:
        trajs = executor.run(job)
    else:
        counter = _Counter(progress, job.episodes)
        trajs = executor.run(job, on_episode=counter)
        counter.finish()
    if len(trajs) != job.episodes:
        raise CoevoError(f"executor {executor.name!r} returned {len(trajs)} trajectories for "
                         f"{job.episodes} episodes")
    seconds = time.perf_counter() - t0
    result = summarize(trajs, env=env_obj.name, split=split, samples=samples, seconds=seconds)
    with store.transaction():
        ev = store.create_evaluation(split=split, env=env_obj.name, run=run, round=round,
                                     checkpoint=ckpt_id, key=key, **hashes)
        if store_trajectories:
            store.add_trajectories(trajs, run=run, round=round, evaluation=ev)
        rows = [_result_row(t) for t in trajs]
        if not store_trajectories:
            rows = [{**r, "trajectory": None} for r in rows]
        result = result.model_copy(update={"evaluation": ev, **hashes, "checkpoint": ckpt_id})
        store.add_results(ev, rows, summary=result.model_dump(mode="json", exclude={"tasks"}))
        if on_stored is not None:
            on_stored(result)
    return result
