"""The RL stage of a round: sample train tasks, roll out G samples each on the live policy,
store the trajectories, take a GRPO step, checkpoint every K steps; resumable from the store.

    for step s in start .. start + steps - 1:          # s = trainer steps done before it
        tasks  = sampler.sample(s, tasks_per_step)      # train split only
        temps  = schedule.temperatures(s, tasks)        # fixed, or tempered by pass rates
        trajs  = rollouts(policy, tasks, G, seed(s), temps)  # the trainer's in-memory model
        store.add_trajectories(trajs, run, round)
        if teacher.due(s): teacher reward on the same tasks, G, seeds (coevo/rl/teacher.py)
        stats  = trainer.train_step(trajs)              # SFT warm-up steps, then GRPO
        if (s + 1 - start) % K == 0 or last: save checkpoint, add its store row

Where rollouts run. By default on an `HFBackend` wrapping the trainer's own peft model and a
tokenizer, so the policy that samples is exactly the one being trained, with no adapter reload
per step (nanochat's chat_rl.py does the same); this is the RL stage of `coevo run` and of
`coevo train` without flags. With an `executor` (`coevo train --executor ray`: Ray actors;
`--rollout-model vllm:PATH` or `openai:URL?tokenizer=PATH`: a vLLM engine or server behind a
LocalExecutor) the stage writes the current adapter to `<checkpoints>/rollout/step-N` before
every step and the job asks the executor's backends to load it (`EpisodeJob.adapter`), so
the remote policy is the trainer's after the same number of updates; storing and training
stay here. The backend's `name` carries the trainer step
(`<base>@step-N`) and each trajectory's `checkpoint` is the newest stored checkpoint the
policy descends from (exact when N is a checkpoint step): the model that sampled a rollout is
recoverable from the store either way.

Determinism and resume. Everything random is a function of (seed, step): the sampler draws
step s's tasks from `Random(f"{seed}:{s}")` (coevo/rl/sampling.py; a capability-aware
sampler weighs them by pass rates of earlier rounds only, read once at construction),
rollout seeds come from `step_seed(seed, s)`, and the trainer's RNG state is in its
checkpoints. So `resume=True` loads the run's latest checkpoint
(sha256 checked against its store row), finds where this round's stage started by walking the
checkpoint parents, and redoes the remaining steps exactly as an uninterrupted run would.
Trajectory ids are derived from (run, round, step, task, sample), so a step that was stored
before a crash but not checkpointed is redone without storing it twice.

Departures: remote rollouts get the weights as a LoRA adapter folder on disk, not pushed
over the wire (on several machines the checkpoint folder must be shared); rollouts from a
backend without token ids are refused (RL trains on the exact sampled ids); infrastructure
failures are excluded from their GRPO group by the trainer and counted here.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from coevo.artifacts import check_writable, run_artifacts
from coevo.envs.base import Environment
from coevo.errors import CoevoError
from coevo.executors import AgentAssets, EpisodeJob, LocalExecutor, resolve_env
from coevo.rl.estimators import EstimatorContext
from coevo.rl.teacher import measure_teacher
from coevo.registry import choice_validators
from coevo.rl.temperature import TEMPERATURES, build_temperature
from coevo.rl.sampling import (  # noqa: F401  (re-exported)
    SAMPLERS,
    CapabilitySampler,
    TaskSampler,
    UniformSampler,
    build_sampler,
    record_sampler,
)
from coevo.trajectory import Trajectory

log = logging.getLogger("coevo.rl")


class StageConfig(BaseModel):
    """What one RL stage does (pydantic, extra="forbid": a typo in the YAML is an error)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(10, ge=1)
    tasks_per_step: int = Field(4, ge=1)
    samples: int = Field(4, ge=2)  # G: GRPO needs at least two samples to compare
    seed: int = 0
    pool_size: int | None = Field(None, ge=1)  # train tasks drawn from (None: the whole split)
    sampler: str = "uniform"  # a coevo.rl.sampling.SAMPLERS name: uniform | capability
    sampler_options: dict[str, Any] = Field(default_factory=dict)  # passed to its factory
    # Per-task sampling temperature (coevo/rl/temperature.py): fixed | tempered.
    temperature: str = "fixed"
    temperature_options: dict[str, Any] = Field(default_factory=dict)
    checkpoint_every: int = Field(5, ge=1)  # K; the last step is always checkpointed
    checkpoint_dir: str | None = None  # default: beside the store, by run id (coevo/artifacts.py)

    _known_temperature, _temperature_options = choice_validators(
        TEMPERATURES, "temperature", "temperature_options")


# --- task sampling: coevo/rl/sampling.py (re-exported: existing imports keep working) ------


def step_seed(seed: int, step: int) -> int:
    """Base rollout seed of trainer step `step` (63 bits, platform-stable).

    >>> step_seed(0, 1) == step_seed(0, 1) != step_seed(0, 2)
    True
    """
    d = hashlib.blake2b(f"coevo-rl:{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") & ((1 << 63) - 1)


def trajectory_id(run_id: str, round: int, step: int, task_id: str, sample: int) -> str:
    """Deterministic trajectory id: a redone step maps onto the rows it already stored."""
    key = f"{run_id}\x00{round}\x00{step}\x00{task_id}\x00{sample}"
    return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def check_checkpoint_dir(path: str | Path, field: str = "rl.stage.checkpoint_dir") -> None:
    """Fail early, with a CoevoError naming `field`, when checkpoints cannot be written under
    `path` (a file in the way, a folder that cannot be created or written): before a run is
    created or a model loaded, not at the first checkpoint."""
    check_writable(Path(path).expanduser(), field)


# --- logging and results -----------------------------------------------------------------------


class StepLog(BaseModel):
    """What the progress callback gets after every step."""

    model_config = ConfigDict(extra="forbid")
    step: int  # trainer steps done after this one
    index: int  # 1-based position within this stage
    of: int  # steps in this stage
    reward_mean: float
    signal_fraction: float
    loss: float
    kl: float
    updated: bool
    rollouts: int
    infra_failures: int
    tokens_sampled: int
    rollout_tokens_per_s: float
    train_tokens_per_s: float
    seconds_rollout: float
    seconds_train: float
    checkpoint: str | None = None  # the store id, when this step saved one
    teacher_weight: float = 0.0  # weight of the teacher term (coevo/rl/teacher.py; 0: none)
    teacher_kl: float = 0.0  # mean sampled reverse KL to the teacher per policy token
    teacher_reward: float | None = None  # the teacher's reward, when measured at this step


class StageResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: str
    round: int
    start_step: int
    end_step: int
    resumed_from: str | None = None  # checkpoint id loaded by resume=True
    checkpoint: str | None  # newest checkpoint id after the stage (what the round hands on)
    checkpoints: list[str] = Field(default_factory=list)  # saved by this call
    steps: list[StepLog] = Field(default_factory=list)
    rollouts: int = 0
    infra_failures: int = 0
    tokens_sampled: int = 0
    seconds: float = 0.0


# --- the stage ---------------------------------------------------------------------------------


def _refuse_untrainable(trajs: Sequence[Trajectory], backend: Any) -> None:
    bad = [t for t in trajs if not t.infra_failed and (not t.trainable or not t.token_ids)]
    if bad:
        t = bad[0]
        raise CoevoError(
            f"rl_stage: trajectory {t.id} (task {t.task_id}) is untrainable: backend "
            f"{t.model or getattr(backend, 'name', '?')!r} returned no token ids / log-probs "
            f"({len(bad)} of {len(trajs)} rollouts); RL needs a backend with a tokenizer "
            "(hf, embedded, vllm, openai:URL?tokenizer=PATH)")


def _stage_start(store: Any, latest: Any, round: int) -> int:
    """Trainer step at which `round`'s stage began, from the checkpoint lineage: the step of
    the newest checkpoint saved before this round (0 if none)."""
    if latest.round != round:
        return latest.step  # crashed before this round's first checkpoint
    c = latest
    while c.parent is not None:
        parent = store.get_checkpoint(c.parent)
        if parent.round != round:
            return parent.step
        c = parent
    return 0


def _per_harness(store: Any, assets: AgentAssets, tasks: list[Any],
                 harness_for: Callable[[int, Any], Any] | None,
                 step: int) -> list[tuple[AgentAssets, list[Any]]]:
    """The step's tasks grouped by the harness each rolls out under, in first-seen order:
    one group with `assets` when no `harness_for` is given."""
    if harness_for is None:
        return [(assets, tasks)]
    groups: dict[str, tuple[AgentAssets, list[Any]]] = {}
    for t in tasks:
        h = harness_for(step, t)
        if h.hash not in groups:
            a = assets.model_copy(update={"harness": h})
            a.put(store)
            groups[h.hash] = (a, [])
        groups[h.hash][1].append(t)
    return list(groups.values())


def _store_new(store: Any, trajs: list[Trajectory], run: str, round: int) -> int:
    """Store the trajectories not stored yet (a redone step); returns how many were new."""
    have = {t.id: t for t in store.trajectories(ids=[t.id for t in trajs])}
    for t in trajs:
        old = have.get(t.id)
        if old is not None and (old.token_ids != t.token_ids or old.reward != t.reward):
            log.warning("redone step: trajectory %s differs from the stored one (kept the "
                        "stored row); nondeterministic kernels?", t.id)
    new = [t for t in trajs if t.id not in have]
    store.add_trajectories(new, run=run, round=round)
    return len(new)


def _publish_adapter(trainer: Any, ckpt_root: Path, step: int) -> str:
    """Write the current adapter for remote rollout workers; keep only this step's folder."""
    import shutil

    root = ckpt_root / "rollout"
    folder = root / f"step-{step}"
    if root.is_dir():
        for old in root.iterdir():
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    trainer.model.save_pretrained(str(folder), safe_serialization=True)
    return str(folder)


def live_policy(trainer: Any, tokenizer: Any, name: str | None = None, **opts: Any):
    """An HFBackend over the trainer's in-memory model: sampling sees every update at once."""
    from coevo.models.hf import HFBackend

    if tokenizer is None:
        tokenizer = getattr(trainer, "tokenizer", None)
    if tokenizer is None:
        raise CoevoError("rl_stage: the live policy needs the model's tokenizer (tokenizer=)")
    return HFBackend(trainer.model, tokenizer, name=name or trainer.base_model or "policy",
                     **opts)


def rl_stage(store: Any, run: str, round: int, env: str | Environment, assets: AgentAssets,
             trainer: Any, cfg: StageConfig, *, tokenizer: Any = None, resume: bool = False,
             sampler: TaskSampler | None = None, backend: Any = None,
             on_step: Callable[[StepLog], None] | None = None,
             parent: str | None = None, executor: Any = None, judge: Any = None,
             harness_for: Callable[[int, Any], Any] | None = None) -> StageResult:
    """Run `cfg.steps` RL steps of `round` (see the module docstring); returns what it did.

    backend: the rollout backend (default: `live_policy(trainer, tokenizer)`; a stand-in in
    tests). parent: the checkpoint the trainer starts from (default: the run's latest).
    resume: continue this round's stage from the run's latest checkpoint.
    executor: roll out elsewhere (Ray actors, or a LocalExecutor over a vLLM engine): before
    every step the current adapter is written to `<checkpoints>/rollout/step-N` and each
    worker loads it (a new folder per step, so a worker can never sample with a stale one;
    on several machines the checkpoint folder must be on a shared file system).
    harness_for(step, task): the harness a task's group rolls out under at that step, in
    place of `assets.harness` (the fst mode draws it from a population; None: assets').
    """
    from coevo.rl.lora import CheckpointError, load_checkpoint, save_checkpoint

    t_stage = time.perf_counter()
    env = resolve_env(env)
    if getattr(trainer, "tokenizer", None) is None and tokenizer is not None:
        trainer.tokenizer = tokenizer  # replays the grammar of constrained turns
    # Estimators that rescore episodes (progress) see the stage's environment and rubric.
    trainer.context = EstimatorContext(env=env, rubric=assets.rubric)
    teacher = trainer.teacher
    teacher.bind(env=env, assets=assets, tokenizer=tokenizer or trainer.tokenizer, store=store)
    run_rec = store.get_run(run)
    store.get_round(run_rec.id, round)  # a clear NotFound before any rollout
    hashes = assets.put(store)
    latest = store.latest_checkpoint(run_rec.id)
    resumed_from = None
    if resume and latest is not None:
        if latest.round is not None and latest.round > round:
            raise CoevoError(f"resume: run {run_rec.name} already has a checkpoint of round "
                             f"{latest.round}, after round {round}")
        try:
            info = load_checkpoint(trainer, latest.path)
        except CheckpointError as exc:
            raise CoevoError(f"resume: checkpoint {latest.id}: {exc}") from None
        if info.sha256 != latest.sha256:
            raise CoevoError(f"resume: checkpoint {latest.id}: {latest.path} has sha256 "
                             f"{info.sha256[:12]}, the store recorded {latest.sha256[:12]}")
        start = _stage_start(store, latest, round)
        parent_id, resumed_from = latest.id, latest.id
    else:
        start = trainer.step_count
        parent_id = parent if parent is not None else (latest.id if latest else None)
    end = start + cfg.steps
    ckpt_root = (Path(cfg.checkpoint_dir) if cfg.checkpoint_dir   # coevo/artifacts.py
                 else run_artifacts(store.engine.url, run_rec.id) / "checkpoints")
    if sampler is None:
        # Built from the store before any step: a capability-aware sampler reads the earlier
        # rounds' pass rates here, once, so a resumed stage draws the same tasks.
        sampler = build_sampler(cfg.sampler, env.tasks("train", cfg.pool_size), cfg.seed,
                                store=store, run=run_rec.id, round=round, samples=cfg.samples,
                                options=cfg.sampler_options)
        record_sampler(store, run_rec.id, round, cfg.sampler, sampler)
    schedule = build_temperature(cfg.temperature, assets.harness.decoding.temperature,
                                 store=store, run=run_rec.id, options=cfg.temperature_options)
    remote = executor is not None
    own_backend = backend is None and not remote
    policy = live_policy(trainer, tokenizer) if own_backend else backend
    base_name = getattr(policy, "name", None) or getattr(executor, "name", "executor")
    executor = executor if remote else LocalExecutor(policy, judge=judge)
    result = StageResult(run=run_rec.id, round=round, start_step=start, end_step=end,
                         resumed_from=resumed_from, checkpoint=parent_id)

    for s in range(trainer.step_count, end):
        tasks = sampler.sample(s, cfg.tasks_per_step)
        temps = schedule.temperatures(s, tasks)
        if own_backend:
            policy.name = f"{base_name}@step-{s}"
        t0 = time.perf_counter()
        adapter = _publish_adapter(trainer, ckpt_root, s) if remote else None
        trajs = [t for a, part in _per_harness(store, assets, tasks, harness_for, s)
                 for t in executor.run(EpisodeJob(
                     env=env, tasks=part, assets=a, samples=cfg.samples,
                     seed=step_seed(cfg.seed, s), split="train", checkpoint=parent_id,
                     adapter=adapter, temperatures=temps))]
        t_roll = time.perf_counter() - t0
        _refuse_untrainable(trajs, policy)
        trajs = [t.model_copy(update={"id": trajectory_id(run_rec.id, round, s, t.task_id,
                                                          t.sample_index), "policy_step": s})
                 for t in trajs]
        _store_new(store, trajs, run_rec.id, round)
        r_teacher, t_trajs = None, []
        if teacher.due(s) and trainer.step_count >= trainer.config.warmup_steps:
            r_teacher, t_trajs = measure_teacher(
                teacher, trainer, tokenizer or trainer.tokenizer, env, tasks, cfg.samples,
                step_seed(cfg.seed, s), temps, judge)
        stats = trainer.train_step(trajs)
        sampled = sum(t.sampled_tokens for t in trajs)
        failures = sum(1 for t in trajs if t.infra_failed)
        due = (trainer.step_count - start) % cfg.checkpoint_every == 0 or trainer.step_count >= end
        info = save_checkpoint(trainer, ckpt_root / f"step-{trainer.step_count}") if due else None
        secs = time.perf_counter() - t0
        # The checkpoint row, the step's charge and its log are written together: a crash
        # before leaves the step to be redone (its charge, keyed by step, is then written
        # once); a crash after has all three, and the resumed stage starts past this step.
        with store.transaction():
            saved = None
            if info is not None:
                rec = store.add_checkpoint(path=str(ckpt_root / f"step-{trainer.step_count}"),
                                           sha256=info.sha256, base_model=info.base_model,
                                           step=info.step, run=run_rec.id, round=round,
                                           parent=parent_id, **hashes)
                parent_id = saved = rec.id
                result.checkpoints.append(rec.id)
            store.charge(run_rec.id, {
                "rollouts": len(trajs) + len(t_trajs),  # the teacher's are charged, not stored
                "tokens": sum(len(t.token_ids) for t in [*trajs, *t_trajs]),
                "train_tokens": sum(len(t.token_ids) for t in trajs if t.trainable),
                "seconds": secs}, round=round, key=f"rl:{round}:{s}")
            entry = StepLog(
                step=trainer.step_count, index=trainer.step_count - start, of=cfg.steps,
                reward_mean=stats.reward_mean, signal_fraction=stats.signal_fraction,
                loss=stats.loss, kl=stats.kl, updated=stats.updated, rollouts=len(trajs),
                infra_failures=failures, tokens_sampled=sampled,
                rollout_tokens_per_s=sampled / t_roll if t_roll > 0 else 0.0,
                train_tokens_per_s=stats.tokens_per_s, seconds_rollout=t_roll,
                seconds_train=stats.seconds, checkpoint=saved,
                teacher_weight=stats.teacher_weight, teacher_kl=stats.teacher_kl,
                teacher_reward=r_teacher)
            if on_step is not None:
                on_step(entry)
        result.steps.append(entry)
        result.rollouts += len(trajs)
        result.infra_failures += failures
        result.tokens_sampled += sampled
        result.checkpoint = parent_id
    if own_backend:
        policy.name = base_name
    result.seconds = time.perf_counter() - t_stage
    return result
