"""Executors: where a batch of episodes runs (in this process, or on Ray actors).

An `EpisodeJob` is everything a batch of episodes needs that can travel: the environment (a
spec string, built where the job runs, or a picklable Environment object), the tasks, the
asset versions (`AgentAssets`), samples per task, the base seed (or every task's own sample
seeds: the gate's), the checkpoint id recorded on the trajectories and, optionally, the LoRA
adapter folder the backend must have loaded. An `Executor` runs a job and returns its
trajectories in (task, sample) order.

- `LocalExecutor(backend, judge=None)`: `run_episodes` in-process on a backend you already hold
  (the RL stage's live policy, a vLLM engine or server that `coevo train --rollout-model`
  names, a scripted backend in tests).
- `RayExecutor(BackendSpec, judge=None)`: N actors, each building its own backend from a
  picklable spec (`load_backend` spec string + options), so nothing large crosses the wire.
  Tasks are cut into contiguous shards (a task's G samples stay on one actor, so a GRPO group
  still shares one prompt prefill), run concurrently, and concatenated back in task order.
  `coevo eval --executor ray` runs evaluations on it, `coevo train --executor ray` the RL
  stage's rollouts (each job names the step's adapter folder; every actor loads it first).

`judge`: the backend that answers the rubric's `llm_judge` criteria (a Backend for the local
executor, a BackendSpec built on each actor for Ray). Without one, a rubric with an llm_judge
criterion cannot be scored: the job refuses to start, naming the criterion.

Why results do not depend on the executor: every sample's seed is `sample_seed(base, task id,
sample index)` and the HF backend draws each sample from its own generator, so the shard a task
lands on changes nothing but float rounding from the batch shape (see coevo/models/hf.py).

Departure from the brief's `ray.init(address=os.environ.get("RAY_ADDRESS"))`: without
RAY_ADDRESS we pass address="local", which always starts a private local instance, because
`ray.init()` with no address may attach to whatever cluster another user on the machine last
started (it reads /tmp/ray/ray_current_cluster). That local instance listens on 127.0.0.1 only
(`start_local_ray`): by default Ray's servers and workers listen on every interface.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coevo.assets.harness import Harness
from coevo.assets.rubric import Rubric
from coevo.assets.skill import Skill, SkillLibrary
from coevo.envs.base import Environment, Task
from coevo.errors import CoevoError, NotFound
from coevo.models.base import Backend
from coevo.registry import Registry
from coevo.trajectory import Trajectory

log = logging.getLogger("coevo.executors")


# --- what a job carries ------------------------------------------------------------------------


class AgentAssets(BaseModel):
    """The asset versions an agent runs with: harness, skill library (+ its member skills), rubric.

    A library without its member Skill objects cannot be rendered, and skills without a library
    would be recorded under a library hash the store never saw, so: given skills and no library,
    the library is `SkillLibrary.from_skills("adhoc", skills)` (what the runtime would hash);
    given a library, every active member must be among `skills` (checked here, once).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    harness: Harness
    rubric: Rubric | None = None
    library: SkillLibrary | None = None
    skills: list[Skill] = Field(default_factory=list)

    @model_validator(mode="after")
    def _library_matches(self) -> "AgentAssets":
        if self.library is None:
            if self.skills:
                object.__setattr__(self, "library", SkillLibrary.from_skills("adhoc", self.skills))
            return self
        try:
            self.library.resolve(self.skills)
        except NotFound as exc:
            raise ValueError(f"skills: {exc}") from None
        return self

    def hashes(self) -> dict[str, str | None]:
        """{harness, skill_library, rubric}: the content hashes trajectories record."""
        return {"harness": self.harness.hash,
                "skill_library": self.library.hash if self.library is not None else None,
                "rubric": self.rubric.hash if self.rubric is not None else None}

    def put(self, store: Any) -> dict[str, str | None]:
        """Store every version (skills before the library that lists them); returns `hashes()`.
        Idempotent, so callers do it before every write that references these hashes."""
        with store.transaction():
            store.put_asset(self.harness)
            for skill in self.skills:
                store.put_asset(skill)
            if self.library is not None:
                store.put_asset(self.library)
            if self.rubric is not None:
                store.put_asset(self.rubric)
        return self.hashes()


class EpisodeJob(BaseModel):
    """One batch of episodes: `samples` episodes of every task, seeded from `seed`."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    env: Any  # a make_env spec string (built where the job runs) or an Environment object
    tasks: list[Task]
    assets: AgentAssets
    samples: int = Field(1, ge=1)
    seed: int = 0  # sample i of task t is seeded sample_seed(seed, t.id, i)
    # Every task's own sample seeds (task id -> `samples` seeds), in place of `seed`: the
    # gate's per-task seeds (coevo.sequential.seed_for).
    task_seeds: dict[str, list[int]] | None = None
    split: str = "train"
    # Task id -> sampling temperature in place of the harness's (the RL stage's temperature
    # schedule, coevo/rl/temperature.py); every turn records the temperature it was sampled at.
    temperatures: dict[str, float] | None = None
    checkpoint: str | None = None  # store checkpoint id, recorded on every trajectory
    adapter: str | None = None  # LoRA folder the backend must have loaded; None: leave it as is
    tool_timeout: float = Field(5.0, gt=0.0)
    max_concurrency: int | None = Field(None, ge=1)

    @field_validator("env")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if isinstance(v, str) or isinstance(v, Environment):
            return v
        raise ValueError(f"expected an environment spec string or an Environment, got "
                         f"{type(v).__name__} (see coevo.envs.base.Environment)")

    @model_validator(mode="after")
    def _seeds_cover_tasks(self) -> "EpisodeJob":
        if self.task_seeds is not None:
            for t in self.tasks:
                got = self.task_seeds.get(t.id)
                if got is None or len(got) != self.samples:
                    raise ValueError(f"task_seeds: task {t.id!r} needs {self.samples} seeds, "
                                     f"got {got!r}")
        return self

    @property
    def episodes(self) -> int:
        return len(self.tasks) * self.samples

    def seeds_of(self, task: Task) -> list[int]:
        """Task `task`'s sample seeds in this job."""
        from coevo.agent.episode import sample_seed

        if self.task_seeds is not None:
            return list(self.task_seeds[task.id])
        return [sample_seed(self.seed, task.id, i) for i in range(self.samples)]


_ENVS: dict[str, Environment] = {}


def resolve_env(env: str | Environment) -> Environment:
    """The Environment a job names; spec strings are built once per process and reused
    (environments keep per-episode state in what `start` returns, not in themselves)."""
    if not isinstance(env, str):
        return env
    if env not in _ENVS:
        from coevo.envs.registry import make_env

        _ENVS[env] = make_env(env)
    return _ENVS[env]


def _ensure_adapter(backend: Any, adapter: str | None) -> None:
    if adapter is None or getattr(backend, "adapter", None) == str(adapter):
        return
    load = getattr(backend, "load_adapter", None)
    if load is None:
        raise CoevoError(f"backend {getattr(backend, 'name', '?')!r} cannot load the LoRA "
                         f"adapter {adapter} (no load_adapter); use an hf or embedded backend")
    load(adapter)


def run_job(job: EpisodeJob, backend: Backend, judge: Backend | None = None,
            on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Run a job on `backend` in this process (what every executor does in the end); `judge`
    answers the rubric's llm_judge criteria; `on_episode(trajectory)` hears each episode end."""
    import asyncio

    from coevo.agent.episode import run_episodes, run_episodes_sync

    env = resolve_env(job.env)
    _ensure_adapter(backend, job.adapter)
    a = job.assets
    check_judge(a.rubric, judge)
    common = dict(samples=job.samples, checkpoint=job.checkpoint, split=job.split,
                  library=a.library, judge=judge, tool_timeout=job.tool_timeout,
                  max_concurrency=job.max_concurrency, temperatures=job.temperatures,
                  on_episode=on_episode)
    if job.task_seeds is None:
        return run_episodes_sync(env, job.tasks, a.harness, a.skills, a.rubric, backend,
                                 seeds=job.seed, **common)

    async def per_task() -> list[Trajectory]:
        # One run_episodes per task (each has its own seeds), all on one batcher, so the
        # backend still sees the whole job's requests together.
        from coevo.models.batching import DynamicBatcher

        batcher = DynamicBatcher(backend, max_batch=max(16, job.episodes))
        try:
            groups = await asyncio.gather(*(
                run_episodes(env, [t], a.harness, a.skills, a.rubric, backend,
                             seeds=job.task_seeds[t.id], batcher=batcher, **common)
                for t in job.tasks))
        finally:
            await batcher.aclose()
        return [t for g in groups for t in g]

    return asyncio.run(per_task())


def check_judge(rubric: Rubric | None, judge: Any) -> None:
    """Refuse, before any episode, a rubric with llm_judge criteria and no judge backend."""
    if judge is not None or rubric is None:
        return
    asks = [c.id for c in rubric.criteria if c.kind == "llm_judge"]
    if asks:
        raise CoevoError(f"rubric {rubric.name!r}: criterion {asks[0]!r} is an llm_judge and no "
                         "judge backend was given (set `judge` in the run config, or give the "
                         "executor a judge)")


def failed_trajectories(job: EpisodeJob, error: str, env_name: str = "") -> list[Trajectory]:
    """Placeholders for episodes lost with their worker: infra_error, missing data (never 0)."""
    h = job.assets.hashes()
    name = env_name or (job.env if isinstance(job.env, str) else getattr(job.env, "name", ""))
    return [Trajectory(env=name, task_id=t.id, split=job.split, sample_index=i,
                       seed=seed, status="infra_error", error=error,
                       trainable=False, checkpoint=job.checkpoint, **h)
            for t in job.tasks for i, seed in enumerate(job.seeds_of(t))]


# --- the contract ------------------------------------------------------------------------------


@runtime_checkable
class Executor(Protocol):
    """Contract:
    - `run(job)` returns exactly `job.episodes` trajectories, in (task, sample) order.
    - The same job on the same weights gives the same trajectories (token ids, masks, rewards)
      whichever executor runs it and however it shards the tasks; ids and timings differ.
    - An episode's infrastructure failure is a trajectory with status "infra_error" (missing
      data), never an exception; a job that cannot start at all (unknown environment, a backend
      that cannot be built) raises `coevo.errors.CoevoError` with a one-line reason.
    - `close()` releases workers; it is idempotent. Executors are context managers.
    - `on_episode(trajectory)`, when given, is called in this process for every trajectory
      once it is back (as each episode ends, or as each worker's share returns): progress only.
    """

    name: str

    def run(self, job: EpisodeJob,
            on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]: ...

    def close(self) -> None: ...


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        pass


class LocalExecutor(_Closing):
    """Runs jobs in this process on `backend` (which may be the trainer's live policy);
    `judge` answers llm_judge criteria (it may be `backend` itself)."""

    name = "local"

    def __init__(self, backend: Backend, judge: Backend | None = None):
        if backend is None:
            raise CoevoError("local executor: needs a backend")
        self.backend, self.judge = backend, judge

    def run(self, job: EpisodeJob,
            on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        return run_job(job, self.backend, self.judge, on_episode)


# --- Ray ---------------------------------------------------------------------------------------


class BackendSpec(BaseModel):
    """A backend that can be rebuilt anywhere: a `load_backend` spec ("embedded", "hf:PATH",
    "openai:URL", ...) and its constructor options (adapter=, device=, dtype=, ...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    spec: str
    options: dict[str, Any] = Field(default_factory=dict)

    def build(self) -> Backend:
        from coevo.models.registry import load_backend

        return load_backend(self.spec, **self.options)


class _EpisodeWorker:
    """A Ray actor: one backend, built once, running the shards it is sent."""

    def __init__(self, backend: BackendSpec, threads: int | None, judge: BackendSpec | None = None):
        if threads:
            import torch

            # Several actors on one machine oversubscribe the cores otherwise.
            torch.set_num_threads(threads)
        self.backend = backend.build()
        self.judge = None if judge is None else (self.backend if judge == backend else judge.build())

    def ready(self) -> str:
        return getattr(self.backend, "name", "")

    def run(self, job: EpisodeJob,
            on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        return run_job(job, self.backend, self.judge, on_episode)


def _shards(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of near-equal size covering range(n), none empty.

    >>> _shards(5, 2)
    [(0, 3), (3, 5)]
    """
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, start = [], 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        out.append((start, end))
        start = end
    return out


def _ray_cause(exc: BaseException) -> BaseException:
    return getattr(exc, "cause", None) or exc


def _one_line(exc: BaseException) -> str:
    """A Ray error's own reason: the cause's message, else the traceback's last line (Ray
    wraps creation-task errors in a multi-line ActorDiedError text)."""
    import ray

    cause = _ray_cause(exc)
    if cause is not exc and not isinstance(cause, ray.exceptions.RayError):
        return f"{type(cause).__name__}: {cause}".splitlines()[-1]
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


LOOPBACK = "127.0.0.1"
_RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def local_ray_kwargs(num_cpus: int, object_store_memory: int | None = None,
                     runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """`ray.init` arguments of a private local instance on the loopback address, no dashboard.

    >>> local_ray_kwargs(2)["_node_ip_address"], local_ray_kwargs(2)["address"]
    ('127.0.0.1', 'local')
    """
    return dict(address="local", num_cpus=num_cpus, object_store_memory=object_store_memory,
                include_dashboard=False, runtime_env=runtime_env, log_to_driver=False,
                _node_ip_address=LOOPBACK)


def start_local_ray(num_cpus: int, object_store_memory: int | None = None,
                    runtime_env: dict[str, Any] | None = None) -> None:
    """Start a private local Ray whose servers (GCS, raylet, object manager, every worker's
    gRPC server, the runtime-env agent) listen on 127.0.0.1 only, not on all interfaces.

    Ray binds them to the loopback only when the node IP is the loopback, and ray.init turns
    an explicit 127.0.0.1 into the machine's routable IP unless multi-node clusters are
    disabled, as Ray does itself on macOS and Windows. So they are disabled while the instance
    starts: in this process (the constant Ray read at import) and in the processes it spawns
    (the environment variable, inherited by the raylet and so by every worker). A node IP
    other than the loopback afterwards is refused rather than left listening.

    Token authentication (Ray's default for a new local cluster): Ray sets RAY_AUTH_MODE=token
    for the whole process, writes a token to ~/.ray/auth_token and caches it in the process;
    its servers read the token from the file again. So once the first instance is up, the
    token file is pinned by its absolute path (RAY_AUTH_TOKEN_PATH, unless the user set it or
    RAY_AUTH_TOKEN): a later instance of the same process, started after HOME changed, would
    otherwise get servers looking for a token file that is not there while the process
    presents the cached token (the GCS server aborts at start)."""
    import ray
    from ray._private import ray_constants

    before_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    before_env = os.environ.get(_RAY_CLUSTERS_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[_RAY_CLUSTERS_ENV] = "0"
    try:
        ray.init(**local_ray_kwargs(num_cpus, object_store_memory, runtime_env))
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(_RAY_CLUSTERS_ENV, None)
        else:
            os.environ[_RAY_CLUSTERS_ENV] = before_env
    _pin_token_file()
    ip = ray.util.get_node_ip_address()
    if ip != LOOPBACK:
        ray.shutdown()
        raise RuntimeError(f"the local Ray node came up on {ip}, not {LOOPBACK}: refusing to "
                           "leave it listening beyond this machine")


def _pin_token_file() -> None:
    """RAY_AUTH_TOKEN_PATH := the token file this process's Ray instance uses (see
    start_local_ray), when token auth is on and the user named no token."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token" or \
            os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    token = Path.home() / ".ray" / "auth_token"
    if token.is_file():
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(token.resolve())


class RayExecutor(_Closing):
    """Runs jobs on `num_actors` Ray actors, each with its own backend built from `backend`.

    Joins the cluster at `address` / $RAY_ADDRESS, or starts a private local one with
    `num_cpus` CPUs (default: one per actor) and no dashboard. If Ray is already initialised in
    this process it is used as is, and left running by `close()`.
    """

    name = "ray"

    def __init__(self, backend: BackendSpec | str, *, num_actors: int = 2,
                 num_cpus: int | None = None, cpus_per_actor: float = 1.0,
                 threads_per_actor: int | None = 1, address: str | None = None,
                 object_store_memory: int | None = None,
                 runtime_env: dict[str, Any] | None = None, ready_timeout_s: float = 600.0,
                 judge: BackendSpec | str | None = None):
        import ray

        if num_actors < 1:
            raise CoevoError(f"ray executor: num_actors must be >= 1, got {num_actors}")
        self.backend = BackendSpec(spec=backend) if isinstance(backend, str) else backend
        self.judge = BackendSpec(spec=judge) if isinstance(judge, str) else judge
        self._started = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS")
            try:
                if address:  # an existing cluster sizes itself and chose its own interfaces
                    ray.init(address=address, include_dashboard=False, runtime_env=runtime_env,
                             log_to_driver=False)
                else:
                    start_local_ray(num_cpus or max(1, int(num_actors * cpus_per_actor)),
                                    object_store_memory=object_store_memory,
                                    runtime_env=runtime_env)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise CoevoError(f"ray executor: cannot start or join Ray "
                                 f"(address={address or 'local'}): {exc}") from None
            self._started = True
        worker = ray.remote(num_cpus=cpus_per_actor)(_EpisodeWorker)
        self._actors = [worker.remote(self.backend, threads_per_actor, self.judge)
                        for _ in range(num_actors)]
        try:
            # Bounded: an actor the cluster cannot place (no free CPUs) would wait forever.
            self.models = ray.get([a.ready.remote() for a in self._actors],
                                  timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources().get("CPU", 0.0)
            self.close()
            raise CoevoError(f"ray executor: {num_actors} actors x {cpus_per_actor} CPUs were "
                             f"not ready within {ready_timeout_s:.0f} s ({free:g} CPUs free in "
                             "the cluster)") from None
        except ray.exceptions.RayError as exc:
            self.close()
            raise CoevoError(f"ray executor: backend {self.backend.spec!r} could not be built "
                             f"on a worker: {_one_line(exc)}") from None

    def run(self, job: EpisodeJob,
            on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        import ray

        if not self._actors:
            raise CoevoError("ray executor: already closed")
        if not job.tasks:
            return []
        check_judge(job.assets.rubric, self.judge)
        ranges = _shards(len(job.tasks), len(self._actors))
        parts = [job.model_copy(update={"tasks": job.tasks[a:b]}) for a, b in ranges]
        refs = [actor.run.remote(p) for actor, p in zip(self._actors, parts)]
        # Wait for every shard before raising, so no result is left unretrieved (Ray logs
        # those as unhandled errors) and a later job does not race a still-running one.
        got: list[Any] = []
        for ref in refs:
            try:
                got.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                got.append(exc)
                continue
            for t in got[-1] if on_episode is not None else ():
                on_episode(t)
        out: list[Trajectory] = []
        for part, res in zip(parts, got):
            if isinstance(res, ray.exceptions.RayTaskError):
                cause = _ray_cause(res)
                if isinstance(cause, CoevoError):
                    raise type(cause)(*cause.args) from None
                raise CoevoError(f"ray executor: a worker failed: {_one_line(res)}") from None
            if isinstance(res, ray.exceptions.RayError):  # the actor died (OOM, killed)
                log.warning("ray worker lost; %d episodes become infra errors: %s",
                            part.episodes, res)
                out.extend(failed_trajectories(part, f"ray worker lost: {_one_line(res)}"))
                continue
            out.extend(res)
        return out

    def close(self) -> None:
        import ray

        for actor in getattr(self, "_actors", []):
            try:
                ray.kill(actor)
            except Exception:  # already dead: nothing to release
                pass
        self._actors = []
        if self._started and ray.is_initialized():
            ray.shutdown()
        self._started = False


# --- registry ----------------------------------------------------------------------------------

EXECUTORS: Registry[Any] = Registry("executor")
EXECUTORS.add("local", LocalExecutor)
EXECUTORS.add("ray", RayExecutor)


def make_executor(name: str, **options: Any) -> Executor:
    """`make_executor("local", backend=b)` or `make_executor("ray", backend=BackendSpec(...),
    num_actors=2)`; an unknown name lists the known ones."""
    return EXECUTORS.get(name)(**options)


def executor_names() -> list[str]:
    return EXECUTORS.names()

