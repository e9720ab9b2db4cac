"""Many episodes at once: tasks x G samples through the harness graph, as Trajectory records.

Every episode is an asyncio task running the compiled harness graph (graph.py); their backend
requests go through one `DynamicBatcher`, which gathers the requests pending at the same moment
into one `backend.generate` call. Episodes in lock-step (a GRPO group, a validation sweep) thus
cost about one batched call per turn, not one call per episode; environment steps and tools run
in threads meanwhile.

Seeds: sample i of task t is seeded `sample_seed(base, t.id, i)`, which depends on neither the
harness nor the batch, so two harness arms compared by the gate draw the same sampling seeds
(the gate pairs on them), and a rerun reproduces a trajectory exactly.

After the graph, each episode is scored by the environment's verifier (`outcome`), by the
rubric (`criteria`), and `reward` combines them (rewards.py). A backend failure makes the
episode `status="infra_error"` with `outcome`/`reward` left None: missing data, never zero.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from coevo.agent.context import ContextError, TokenSequence
from coevo.agent.demos import held_out_ids, select_demos
from coevo.agent.graph import EpisodeContext, run_graph
from coevo.agent.skills import select_skills, skill_query
from coevo.agent.tools import TOOLS, Tool, resolve_tools
from coevo.assets.harness import Harness, demo_messages
from coevo.envs.base import Environment, Task
from coevo.errors import CoevoError, InfraError
from coevo.models.base import Backend, Completion, Request
from coevo.models.batching import DynamicBatcher
from coevo.rewards import ascore_rubric, reward
from coevo.trajectory import Trajectory

DEFAULT_TOOL_TIMEOUT_S = 5.0


def sample_seed(base: int, task_id: str, index: int) -> int:
    """The sampling seed of sample `index` of task `task_id` (63 bits, platform-stable).

    >>> sample_seed(0, "t1", 0) == sample_seed(0, "t1", 0) != sample_seed(0, "t1", 1)
    True
    """
    digest = hashlib.blake2b(f"{base}\x00{task_id}\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _group_id(parts: Sequence[Any]) -> str:
    return hashlib.blake2b("\x00".join(map(str, parts)).encode(), digest_size=8).hexdigest()


def _library_hash(library: Any, skills: Sequence[Any]) -> str | None:
    if library is not None:
        return library.hash
    if not skills:
        return None
    from coevo.assets.skill import SkillLibrary

    return SkillLibrary.from_skills("adhoc", skills).hash


def build_messages(harness: Harness, task: Task, active_skills: list[Any],
                   held_out: Collection[str] = ()) -> list[dict]:
    """System (harness.render_system: prompt, the task's functions and the harness's own
    tools, the active skills, answer format) + the task's few-shot demos (agent/demos.py:
    all static demos, or the top-k retrieved, never from `held_out` tasks) + the task's
    messages."""
    system = harness.render_system(task.tools, active_skills)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.extend(demo_messages(select_demos(harness, task, held_out)))
    messages.extend(dict(m) for m in task.messages)
    return messages


def first_prompt(harness: Harness, task: Task, skills: Sequence[Any] = (),
                 held_out: Collection[str] = ()
                 ) -> tuple[list[dict], list[dict] | None, list[Any]]:
    """What an episode's first prompt is built from: its messages (`build_messages` with the
    skills the harness activates for the task; retrieved demos never from `held_out` tasks),
    the tool specs the chat template renders itself (None unless tool_format is chat_template)
    and the active skills."""
    active = select_skills(list(skills), skill_query(task.messages, task.tools),
                           top_k=harness.skills.top_k, method=harness.skills.method)
    template_tools = None
    if harness.tool_format == "chat_template":  # the template renders the tool docs itself
        template_tools = harness.tool_specs(task.tools)
    return build_messages(harness, task, active, held_out), template_tools, active


def harness_tools(harness: Harness, scored_only: bool = False) -> dict[str, Tool]:
    """The implementations of the harness's own tools (agent/tools.py registry). With
    `scored_only` (a single-turn environment: calls are scored, never executed) a tool coevo
    does not implement is allowed: it is a declared function of the deploying application
    (an imported OpenAI harness), shown to the model and checked by the verifier."""
    specs = [t for t in harness.tools if not scored_only or t.function.name in TOOLS]
    try:
        return resolve_tools([t.function.name for t in specs],
                             {t.function.name: t.sandbox for t in specs})
    except CoevoError as exc:  # an unknown tool, a sandbox setting on a tool without code
        raise CoevoError(f"harness {harness.name!r}: tools: {exc}") from None


class _Batched:
    """`generate(request) -> Completion` over the DynamicBatcher (one completion: n=1)."""

    def __init__(self, batcher: Any):
        self.batcher = batcher

    async def __call__(self, request: Request) -> Completion:
        try:
            out = await self.batcher.generate(request)
        except Exception as exc:  # a batcher/backend crash is this episode's missing data
            return Completion(text="", finish_reason="error", trainable=False,
                              error=f"{type(exc).__name__}: {exc}")
        if isinstance(out, list):
            out = out[0] if out else Completion(text="", finish_reason="error", trainable=False,
                                                error="backend returned no completion")
        return out


def task_text(task: Task) -> str:
    """What `decoding.constrain.strings: copy` copies from: the task's user messages."""
    return "\n".join(m["content"] for m in task.messages
                     if m.get("role") == "user" and isinstance(m.get("content"), str))


async def run_episode(env: Environment, task: Task, harness: Harness, *, generate: Any,
                      tokenizer: Any, seed: int, skills: Sequence[Any] = (),
                      rubric: Any = None, judge: Backend | None = None,
                      tool_timeout: float = DEFAULT_TOOL_TIMEOUT_S,
                      temperature: float | None = None,
                      held_out: Collection[str] = ()) -> Trajectory:
    """One episode through the harness graph, scored; the Trajectory without run identity
    fields (group, sample index, asset hashes), which `run_episodes` fills in. `temperature`
    replaces the harness's sampling temperature (None: the harness's). `held_out`: task ids
    whose demos are never retrieved (the environment's val and test tasks)."""
    t0 = time.perf_counter()
    wf = harness.workflow
    own_tools = harness_tools(harness, scored_only=env.single_turn)
    messages, template_tools, active = first_prompt(harness, task, skills, held_out)
    traj = Trajectory(env=env.name, task_id=task.id, seed=seed,
                      active_skills=[s.name for s in active])
    try:
        seq = TokenSequence(tokenizer, messages, tools=template_tools)
    except ContextError as exc:
        return traj.model_copy(update={"status": "infra_error", "error": str(exc),
                                       "messages": messages, "trainable": False})
    state = None if env.single_turn else await asyncio.to_thread(env.start, task)
    sampling = harness.sampling(seed)
    if temperature is not None:
        sampling = sampling.model_copy(update={"temperature": float(temperature)})
    ep = EpisodeContext(
        env=env, task=task, seq=seq, generate=generate, sampling=sampling,
        tool_format=harness.tool_format, max_turns=1 if env.single_turn else wf.max_turns,
        extract=wf.answer_extraction.extract, reflection_prompt=wf.reflection_prompt,
        tools=own_tools, env_state=state, tool_timeout=tool_timeout,
        constrain=(functools.partial(harness.constraint, copy_from=task_text(task))
                   if harness.decoding.constrain.mode != "none" else None))
    try:
        await run_graph(ep, reflect_on_tool_error=wf.reflect_on_tool_error)
    except ContextError as exc:  # the template cannot continue this conversation
        ep.error = f"context: {exc}"
    t_graph = time.perf_counter()

    update: dict[str, Any] = dict(
        messages=seq.messages, token_ids=seq.ids, loss_mask=seq.mask, logprobs=seq.logprobs,
        prompt_len=seq.prompt_len, turns=ep.turns, trainable=seq.trainable and ep.trainable,
        answer=ep.answer)
    timings = {"generate": ep.seconds_generate, "tools": ep.seconds_tools}
    if ep.error is not None or ep.response is None:
        update.update(status="infra_error", error=ep.error or "episode produced no response",
                      trainable=False)
    else:
        try:
            score = await asyncio.to_thread(env.score, task, state, ep.response)
        except InfraError as exc:
            update.update(status="infra_error", error=f"verifier: {exc}", trainable=False)
        else:
            criteria = {}
            if rubric is not None:
                criteria = await ascore_rubric(rubric, task, ep.response, score, judge=judge,
                                              trajectory=traj.model_copy(update=update))
            update.update(outcome=score.outcome, success=score.success, criteria=criteria,
                          reward=reward(rubric, score.outcome, criteria))
        timings["score"] = time.perf_counter() - t_graph
    timings["total"] = time.perf_counter() - t0
    update["timings"] = timings
    return traj.model_copy(update=update)


def _seeds_for(seeds: int | Sequence[int], task: Task, samples: int) -> list[int]:
    if isinstance(seeds, int):
        return [sample_seed(seeds, task.id, i) for i in range(samples)]
    seeds = list(seeds)
    if len(seeds) != samples:
        raise CoevoError(f"seeds: {len(seeds)} given for samples={samples}")
    return seeds


async def run_episodes(env: Environment, tasks: Sequence[Task], harness: Harness,
                       skills: Sequence[Any] = (), rubric: Any = None,
                       backend: Backend | None = None, *, samples: int = 1,
                       seeds: int | Sequence[int] = 0, checkpoint: str | None = None,
                       split: str = "train", library: Any = None, judge: Backend | None = None,
                       batcher: Any = None, tool_timeout: float = DEFAULT_TOOL_TIMEOUT_S,
                       max_concurrency: int | None = None,
                       temperatures: dict[str, float] | None = None,
                       on_episode: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """Run `samples` episodes of every task concurrently; trajectories in (task, sample) order.

    seeds: an int is the base seed (sample i of task t gets `sample_seed(base, t.id, i)`);
    a list gives sample i's seed for every task. library: the SkillLibrary that `skills`
    belong to (its hash is recorded; members are resolved from `skills` by hash). judge: the
    backend asked by llm_judge criteria. batcher: an existing DynamicBatcher to share.
    temperatures: task id -> sampling temperature in place of the harness's.
    on_episode: called with each trajectory as its episode ends (progress display).
    """
    if backend is None and batcher is None:
        raise CoevoError("run_episodes: give a backend (or a batcher)")
    if samples < 1:
        raise CoevoError(f"samples: must be >= 1, got {samples}")
    own_batcher = batcher is None
    if batcher is None:
        # One batch can hold every episode's request: the backend splits it by its own
        # max_batch, so a turn of N episodes is ceil(N / backend batch) calls, not N / 16.
        batcher = DynamicBatcher(backend, max_batch=max(16, len(tasks) * samples))
    backend = backend if backend is not None else batcher.backend
    skill_list = list(library.resolve(skills)) if library is not None else list(skills)
    hashes = dict(harness=harness.hash, skill_library=_library_hash(library, skill_list),
                  rubric=rubric.hash if rubric is not None else None)
    generate = _Batched(batcher)
    tokenizer = getattr(backend, "tokenizer", None)
    held_out = held_out_ids(env, harness)  # a retrieval pool never serves val / test tasks
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(task: Task, index: int, seed: int, group: str) -> Trajectory:
        async def go() -> Trajectory:
            return await run_episode(env, task, harness, generate=generate, tokenizer=tokenizer,
                                     seed=seed, skills=skill_list, rubric=rubric, judge=judge,
                                     tool_timeout=tool_timeout,
                                     temperature=(temperatures or {}).get(task.id),
                                     held_out=held_out)
        if limit is None:
            traj = await go()
        else:
            async with limit:
                traj = await go()
        traj = traj.model_copy(update=dict(
            split=split, group_id=group, sample_index=index, checkpoint=checkpoint,
            model=getattr(backend, "name", ""), **hashes))
        if on_episode is not None:
            on_episode(traj)
        return traj

    jobs = []
    for task in tasks:
        group = _group_id([hashes["harness"], hashes["skill_library"], hashes["rubric"],
                           checkpoint, task.id, seeds if isinstance(seeds, int) else 0])
        for i, seed in enumerate(_seeds_for(seeds, task, samples)):
            jobs.append(one(task, i, seed, group))
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        if own_batcher:
            await batcher.aclose()


def run_episodes_sync(*args: Any, **kwargs: Any) -> list[Trajectory]:
    """`run_episodes` for synchronous callers (the CLI, the RL stage, the gate)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_episodes(*args, **kwargs))
    raise CoevoError("run_episodes_sync called inside an event loop; await run_episodes")
