"""The teacher signal: on-policy distillation from the same base model under a richer context.

`rl.train.teacher: {kind: distill, harness: ..., demos: [...], weight: w0, schedule: {...}}`
adds, on the student's own sampled completions, a per-token reverse-KL term towards a teacher
that is the SAME base model (the LoRA adapter switched off: no second copy of the weights)
reading a richer context: the teacher harness (a named harness version, or the incumbent's)
with extra demos and optionally another skill library. The student is the policy under the
lean incumbent harness. This is on-policy distillation (GKD: Agarwal et al. 2024, "On-Policy
Distillation of Language Models: Learning from Self-Generated Mistakes"; Thinking Machines,
"On-Policy Distillation", 2025) with the teacher's advantage being its context, as in context
distillation, rather than its size.

What is scored. For a student trajectory with first prompt x_S (prompt_len tokens) and the rest
y (its sampled turns and the observations between them, exactly as stored), the teacher reads
x_T + y, where x_T is the first prompt the teacher harness renders for the same task (built by
coevo.agent.episode.first_prompt, as an episode would build it). The student's sampled tokens
are the same tokens at positions shifted by len(x_T) - len(x_S); each is scored under the
distribution it was sampled from (temperature, top-k / top-p, grammar: coevo/rl/processing.py).

The term (per sampled token t, one no-grad teacher pass before the update, like the reference
log-probs of the KL penalty):

    d_t   = log pi_old(y_t | x_S, y_<t) - log pi_T(y_t | x_T, y_<t)   (k1 sample of KL(student||teacher))
    L_T   = w * agg_t[ sg(d_t) * rho_t ],    rho_t = pi(y_t | ...) / pi_old(y_t | ...)

At the first update rho = 1, so L_T = w * mean_t d_t (the sampled reverse KL per token) and
grad L_T = w * mean_t d_t * grad log pi(y_t): the policy gradient with per-token reward
-d_t = log pi_T - log pi_old and discount 0, Thinking Machines' formulation (their advantage is
exactly this per-token log-ratio). The ratio keeps the term correct on later updates of the same
batch (num_updates_per_batch > 1). `agg` and the denominator are the GRPO term's
(coevo/rl/grpo.py), so micro-batching never changes the gradient.

Choice made: the sampled-token estimate, not the exact reverse KL over the vocabulary at the
sampled positions. The exact form needs the teacher's whole distribution [V] next to the
student's at every position (49k floats a token on the embedded model) inside the
gradient pass; the sampled form needs one stored number per token, costs one extra forward,
and is unbiased for the reverse KL in expectation over the student's samples (higher variance
per token).

Where it applies: every included trajectory, also in groups whose rewards are all equal (no
GRPO signal): dense supervision exactly where the reward gives none. The GRPO term still sees
only the groups with signal, with its own denominator, so turning the teacher on never
rescales it; `signal_fraction` keeps its meaning.

Weight schedule (`schedule.kind: gap`, default), in the spirit of the reward-gap schedules of
GATS / TIDE: the term fades as the student's reward approaches the teacher's,

    w = w0 * clip((R_T - R_S) / max(R_T, eps), 0, 1)

R_S: the mean of the last `window` steps' mean rewards of the student (the trainer records
every step's); R_T: the mean of the last `window` teacher measurements. The RL stage measures
the teacher every `every` trainer steps (step s with s % every == 0): the teacher harness on
the base model, on the step's tasks, with the step's G and sampling seeds, scored by the
student's rubric (so the rewards compare). Before the first measurement w = w0. `constant`:
w = w0 always. The running means are part of the trainer's checkpoint (trainer_state.pt), so
a resumed stage weighs exactly as an uninterrupted one.

Departures and limits: the teacher needs the LoRA adapter (`lora.enabled`): full fine-tuning
keeps no frozen copy. The teacher's measurement rollouts run in-process on the trainer's model
(also when the student rolls out on a remote executor), are charged as rollouts but not stored
(they are no policy's trajectories). Registry `TEACHERS`: `none` (default, no term, no cost)
and `distill`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coevo.assets.harness import Demo
from coevo.errors import CoevoError
from coevo.registry import Registry
from coevo.rl.grpo import Agg, aggregate
from coevo.trajectory import Trajectory

TEACHERS: Registry[Any] = Registry("teacher")


class TeacherSchedule(BaseModel):
    """How the term's weight moves (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["gap", "constant"] = "gap"
    every: int = Field(5, ge=1)  # measure the teacher's reward every N trainer steps
    window: int = Field(10, ge=1)  # running means over the last N entries
    eps: float = Field(1e-6, gt=0.0)


class TeacherConfig(BaseModel):
    """`rl.train.teacher`. harness: a stored harness (name, name@hash, hash prefix) or a YAML
    file; None = the incumbent's. skill_library: a stored library; None = the incumbent's.
    demos: appended to the teacher harness's own (at most 16 in all)."""

    model_config = ConfigDict(extra="forbid")
    kind: str = "none"
    harness: str | None = None
    skill_library: str | None = None
    demos: list[Demo] = Field(default_factory=list)
    weight: float = Field(0.1, ge=0.0)  # w0
    schedule: TeacherSchedule = Field(default_factory=TeacherSchedule)

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        return TEACHERS.check(v)

    @model_validator(mode="after")
    def _richer(self) -> "TeacherConfig":
        if self.kind == "distill" and not (self.harness or self.skill_library or self.demos):
            raise ValueError("a distill teacher reads a richer context than the student: give "
                             "harness, skill_library or demos")
        return self


# --- the maths (pure tensors and numbers) --------------------------------------------------------


def gap_weight(w0: float, r_teacher: float | None, r_student: float | None,
               eps: float = 1e-6) -> float:
    """w0 * clip((R_T - R_S) / max(R_T, eps), 0, 1); w0 while either reward is unknown.

    >>> gap_weight(0.5, 0.8, 0.2)
    0.375
    >>> gap_weight(0.5, 0.6, 0.7), gap_weight(0.5, 0.0, 0.0), gap_weight(0.5, None, 0.3)
    (0.0, 0.0, 0.5)
    """
    if r_teacher is None or r_student is None:
        return float(w0)
    gap = (r_teacher - r_student) / max(r_teacher, eps)
    return float(w0) * min(max(gap, 0.0), 1.0)


def distill_loss(
    new_logp: torch.Tensor,  # [B, W] log pi(token), current policy, with grad
    old_logp: torch.Tensor,  # [B, W] log pi_old(token): the sampler's (or recomputed)
    teacher_logp: torch.Tensor,  # [B, W] log pi_T(token) under the teacher's context
    mask: torch.Tensor,  # [B, W] 1 on sampled tokens
    weight: float,
    agg: Agg = "token",
    denom: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """w * agg(sg(d) * rho) with d = old - teacher, rho = exp(new - old); metrics:
    teacher_kl (mean d over the tokens: the sampled reverse KL per token)."""
    live = mask > 0
    zero = torch.zeros_like(new_logp)
    d = torch.where(live, old_logp - teacher_logp, zero).detach()
    rho = torch.exp(torch.where(live, new_logp - old_logp, zero))
    loss = weight * aggregate(d * rho, live, agg, denom)
    n = max(float(live.sum()), 1.0)
    return loss, {"teacher_kl": float(d.sum()) / n}


def running_mean(values: Sequence[float], window: int) -> float | None:
    """Mean of the last `window` values (None when there are none).

    >>> running_mean([1.0, 0.0, 0.5, 1.0], 2)
    0.75
    """
    tail = list(values)[-window:]
    return sum(tail) / len(tail) if tail else None


# --- the extension point -------------------------------------------------------------------------


@runtime_checkable
class Teacher(Protocol):
    """Contract. `weight()` is the term's weight for the next update (0: no term, no teacher
    pass). The trainer calls `observe_student(mean reward)` once per GRPO step before asking
    the weight; the RL stage calls `bind(...)` before its first step, and at the steps where
    `due(step)` holds rolls out `assets()` on the frozen base and reports the mean reward with
    `observe_teacher`. `prompt_ids(traj)` is the teacher's first prompt for the trajectory's
    task. `state_dict()` holds plain numbers only (saved in the trainer's checkpoint)."""

    config: TeacherConfig

    def weight(self) -> float: ...
    def observe_student(self, reward: float) -> None: ...
    def observe_teacher(self, reward: float) -> None: ...
    def due(self, step: int) -> bool: ...
    def bind(self, *, env: Any, assets: Any, tokenizer: Any, store: Any = None) -> None: ...
    def assets(self) -> Any: ...
    def prompt_ids(self, traj: Trajectory) -> list[int]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@TEACHERS.register("none")
class NoTeacher:
    """The stand-in: no term, no teacher pass, nothing measured."""

    def __init__(self, config: TeacherConfig | None = None):
        self.config = config or TeacherConfig()

    def weight(self) -> float:
        return 0.0

    def observe_student(self, reward: float) -> None:
        pass

    def observe_teacher(self, reward: float) -> None:
        pass

    def due(self, step: int) -> bool:
        return False

    def bind(self, *, env: Any, assets: Any, tokenizer: Any, store: Any = None) -> None:
        pass

    def assets(self) -> Any:
        return None

    def prompt_ids(self, traj: Trajectory) -> list[int]:
        raise CoevoError("the 'none' teacher has no context")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@TEACHERS.register("distill")
class DistillTeacher:
    """The base model under the teacher harness (see the module docstring)."""

    def __init__(self, config: TeacherConfig):
        self.config = config
        self.student_rewards: list[float] = []
        self.teacher_rewards: list[float] = []
        self._assets: Any = None
        self._env: Any = None
        self._tokenizer: Any = None
        self._tasks: dict[str, Any] = {}
        self._prompts: dict[str, list[int]] = {}

    # -- schedule ------------------------------------------------------------------------------
    def means(self) -> tuple[float | None, float | None]:
        """(R_T, R_S): the running means the weight is computed from."""
        w = self.config.schedule.window
        return running_mean(self.teacher_rewards, w), running_mean(self.student_rewards, w)

    def weight(self) -> float:
        s = self.config.schedule
        if s.kind == "constant":
            return float(self.config.weight)
        r_t, r_s = self.means()
        return gap_weight(self.config.weight, r_t, r_s, s.eps)

    def observe_student(self, reward: float) -> None:
        self.student_rewards = [*self.student_rewards, float(reward)][-self.config.schedule.window:]

    def observe_teacher(self, reward: float) -> None:
        self.teacher_rewards = [*self.teacher_rewards, float(reward)][-self.config.schedule.window:]

    def due(self, step: int) -> bool:
        return self.config.schedule.kind == "gap" and step % self.config.schedule.every == 0

    def state_dict(self) -> dict[str, Any]:
        return {"student_rewards": list(self.student_rewards),
                "teacher_rewards": list(self.teacher_rewards)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.student_rewards = [float(x) for x in state.get("student_rewards", [])]
        self.teacher_rewards = [float(x) for x in state.get("teacher_rewards", [])]

    # -- context -------------------------------------------------------------------------------
    def bind(self, *, env: Any, assets: Any, tokenizer: Any, store: Any = None) -> None:
        """Resolve the teacher's assets against the stage's incumbent `assets` (AgentAssets)."""
        self._env, self._tokenizer = env, tokenizer
        self._assets = teacher_assets(self.config, assets, store)
        self._tasks, self._prompts = {}, {}

    def assets(self) -> Any:
        if self._assets is None:
            raise CoevoError("rl.train.teacher: not bound to an environment and assets "
                             "(the RL stage binds it; call teacher.bind(...) outside a stage)")
        return self._assets

    def _task(self, task_id: str) -> Any:
        if task_id not in self._tasks:
            for split in ("train", "val", "test"):
                self._tasks.update((t.id, t) for t in self._env.tasks(split))
                if task_id in self._tasks:
                    break
        if task_id not in self._tasks:
            raise CoevoError(f"rl.train.teacher: task {task_id!r} is not served by "
                             f"environment {getattr(self._env, 'name', '?')!r}")
        return self._tasks[task_id]

    def prompt_ids(self, traj: Trajectory) -> list[int]:
        from coevo.agent.context import TokenSequence
        from coevo.agent.episode import first_prompt

        a = self.assets()
        if traj.task_id not in self._prompts:
            skills = list(a.library.resolve(a.skills)) if a.library is not None else list(a.skills)
            messages, tools, _ = first_prompt(a.harness, self._task(traj.task_id), skills)
            self._prompts[traj.task_id] = TokenSequence(self._tokenizer, messages, tools=tools).ids
        return list(self._prompts[traj.task_id])


def teacher_assets(cfg: TeacherConfig, incumbent: Any, store: Any = None) -> Any:
    """AgentAssets of the teacher: the configured (or incumbent) harness plus the extra demos,
    the configured (or incumbent) skill library, and the incumbent's rubric (rewards compare)."""
    from coevo.executors import AgentAssets

    harness, library, skills = incumbent.harness, incumbent.library, list(incumbent.skills)
    if cfg.harness:
        harness = _stored_or_file(cfg.harness, "harness", store)
    if cfg.skill_library:
        if store is None:
            raise CoevoError("rl.train.teacher.skill_library: needs the store")
        library, skills = store.get_library(cfg.skill_library)
    if cfg.demos:
        demos = [*harness.demos, *cfg.demos]
        if len(demos) > 16:
            raise CoevoError(f"rl.train.teacher.demos: the teacher harness would hold "
                             f"{len(demos)} demos (at most 16)")
        harness = harness.child(demos=[d.model_dump() for d in demos])
    return AgentAssets(harness=harness, rubric=incumbent.rubric, library=library, skills=skills)


def _stored_or_file(ref: str, kind: str, store: Any) -> Any:
    from pathlib import Path

    from coevo.assets.io import load_asset

    if ref.endswith((".yaml", ".yml")) and Path(ref).is_file():
        return load_asset(ref, kind)
    if store is None:
        raise CoevoError(f"rl.train.teacher.{kind}: {ref!r} is not a file and there is no store")
    try:
        return store.get_asset(kind, ref)
    except CoevoError as exc:
        raise CoevoError(f"rl.train.teacher.{kind}: {exc}") from None


def make_teacher(config: TeacherConfig | None) -> Teacher:
    config = config or TeacherConfig()
    return TEACHERS.get(config.kind)(config)


# --- the teacher's context for a trained sample, and its reward ---------------------------------


def shift_processing(proc: Any, offset: int) -> Any:
    """A sample's TokenProcessing with every position moved by `offset` (the teacher's
    sequence holds the same sampled tokens `offset` positions later)."""
    if proc is None:
        return None
    from coevo.rl.processing import TokenProcessing

    return TokenProcessing(settings={p + offset: s for p, s in proc.settings.items()},
                           spans=[(a + offset, b + offset, c) for a, b, c in proc.spans],
                           bitmask={p + offset: m for p, m in proc.bitmask.items()})


def teacher_sample(sample: Any, prompt_ids: Sequence[int]) -> tuple[Any, int]:
    """(the teacher's Sample, offset): the teacher prompt followed by the student's sequence
    after its first prompt (prompt_len tokens), mask and processing shifted by offset =
    len(prompt_ids) - prompt_len. The tokens scored (mask 1) are the student's, in order."""
    from coevo.rl.batch import Sample

    p, m = sample.prompt_len, len(prompt_ids)
    if p <= 0:
        raise CoevoError(f"trajectory {sample.traj_id}: prompt_len is 0; the teacher replaces "
                         "the first prompt and needs to know where it ends")
    ids = torch.cat([torch.tensor(list(prompt_ids), dtype=torch.long), sample.ids[p:]])
    mask = torch.cat([torch.zeros(m), sample.mask[p:]])
    return Sample(traj_id=sample.traj_id, group=sample.group, ids=ids, mask=mask,
                  old_logp=torch.zeros(ids.numel()), advantage=0.0, reward=sample.reward,
                  prompt_len=m, processing=shift_processing(sample.processing, m - p)), m - p


def to_student_positions(teacher_logp: torch.Tensor, sample: Any, offset: int) -> torch.Tensor:
    """[n] teacher log-probs at the student's positions (0 in the first prompt)."""
    p = sample.prompt_len
    out = torch.zeros(sample.n, dtype=torch.float32)
    out[p:] = teacher_logp[p + offset:].float()
    return out * sample.mask


class FrozenBase:
    """A backend over the trainer's model with its LoRA adapter switched off for every call:
    the teacher's policy (attributes other than `generate` are the wrapped backend's)."""

    def __init__(self, inner: Any, model: Any):
        self.inner, self.model = inner, model

    def generate(self, requests: Any) -> Any:
        with self.model.disable_adapter():
            return self.inner.generate(requests)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def measure_teacher(teacher: Teacher, trainer: Any, tokenizer: Any, env: Any, tasks: Sequence[Any],
                    samples: int, seed: int, temperatures: dict[str, float] | None = None,
                    judge: Any = None) -> tuple[float | None, list[Trajectory]]:
    """Roll the teacher out on `tasks` (the base model, the teacher's assets, the student's
    rubric, G and seeds); observe its mean reward. Returns (mean reward or None, rollouts)."""
    from coevo.executors import EpisodeJob, run_job
    from coevo.rl.stage import live_policy

    policy = live_policy(trainer, tokenizer, name=f"{trainer.base_model or 'policy'}@teacher")
    backend = FrozenBase(policy, trainer.model)
    trajs = run_job(EpisodeJob(env=env, tasks=list(tasks), assets=teacher.assets(),
                               samples=samples, seed=seed, split="train",
                               temperatures=temperatures), backend, judge)
    rewards = [float(t.reward) for t in trajs if not t.infra_failed and t.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    if mean is not None:
        teacher.observe_teacher(mean)
    return mean, trajs
