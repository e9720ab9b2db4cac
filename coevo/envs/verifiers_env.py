"""`verifiers:pkg.module:factory`: a PrimeIntellect verifiers (0.4, `verifiers.v1`) taskset
played by coevo's harness.

verifiers 0.4 splits an environment into a *taskset* (rows as typed `Task`s, their
`@vf.reward` / `@vf.metric` scoring methods and their MCP `Toolset`s) and a *harness* (the
agent program that calls the model). coevo is the harness here, so the adapter takes the
taskset and plays it with coevo's own runtime:

- spec: `verifiers:pkg.module:factory?key=value` imports `factory` and calls it with the query
  options (values read as JSON when they parse); it returns a `vf.Taskset`, or a `vf.Env`
  whose `.taskset` is used. `verifiers:<taskset-id>` (no second colon) loads an installed
  taskset package through verifiers' own loader, the options being its `TasksetConfig` fields.
  Adapter options, not passed on: `split` (coevo/envs/splits.py), `limit` (the first N rows;
  required for an infinite taskset), `call_timeout` (seconds per tool call, default 30).
- Task: one per row of the taskset's iteration. `id` is the row's `data.id`, else the task
  class's own `key` when it overrides it, else the first 16 hex digits of the sha256 of the
  row's data without its positional `idx`: reordering rows moves no task between splits.
  `messages`: the row's `prompt` (a string or chat messages, text only); its `system_prompt`
  is put before the first user message's text, because the harness owns the system message.
  `tools`: every `@vf.tool` of the task's and the taskset's toolsets, named
  `<server>_<tool>` and described by the same JSON schema MCP would advertise (MCP's own
  `Tool.from_function`). `answer`: the row's data (for display; scoring uses the live task).
- Tool calls: run in-process against fresh task-scoped toolsets per episode (`setup`,
  `setup_task`) and shared taskset toolsets (one per environment, `setup` once). Arguments
  are validated and results rendered by MCP's own function metadata; the episode's `State`
  object is the one tools see as `self.state` and rewards see as `trace.state`.
- Score: the rollout becomes a `vf.Trace` (the row's system prompt and prompt, one assistant
  message per tool-calling turn with its calls, the tool results, and a final assistant
  message holding `Response.text`, the harness's extracted answer), and the task's own
  `Task.score(trace)` runs every reward and metric. `Score.details` holds each reward's
  unweighted score under its name and each metric as `metric:<name>`; `Score.outcome` is the
  weighted reward sum (`trace.reward`) clipped to [0, 1] (the raw sum and the weights are
  in `info`); `success` is outcome == 1. A reward or metric that raises makes the verifier
  fail (`InfraError`: missing data, not a zero).

Not supported, refused with one line rather than half-run: tasks that need a container
(`NEEDS_CONTAINER`) or override `setup` / `finalize` / `stage_verifier` (they need a
verifiers runtime), rewards or metrics that take a `runtime`, and configured judges (they
call a judge model). Ignored: verifiers' rollout machinery (its `Env.run` and user
simulation, harnesses, interception server, retries, `@vf.stop` predicates, token limits:
coevo's harness sets turns and decoding), image content (text only), and assistant text of
turns before the last (the Environment contract hands the verifier the final answer and
the tool calls, not every turn's prose).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import inspect
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from coevo.envs.base import Response, Score, Task
from coevo.envs.registry import import_factory, spec_name
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall, ToolResult

INSTALL = ("pip install 'coevo[verifiers]' && pip install --no-deps verifiers==0.4.0 "
           "(see requirements-nodeps.txt)")


def import_vf() -> Any:
    """`verifiers.v1`, or one CoevoError line saying how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise CoevoError(f"verifiers: environments need the verifiers package: {INSTALL}") from None
    return vf


class EventLoop:
    """One asyncio loop in a daemon thread. verifiers' hooks are coroutines, and a toolset's
    `setup` may bind clients to the loop that ran it, so every call of one environment runs
    on the same loop (the runtime calls `start` / `step` / `score` from worker threads)."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name=name, daemon=True).start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout:g} s") from None


@dataclass
class BoundTool:
    """One `@vf.tool` method of a toolset instance, with MCP's metadata for it."""

    toolset: Any
    fn: Any
    mcp: Any  # mcp.server.mcpserver.tools.base.Tool

    @property
    def spec(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.mcp.name, "description": self.mcp.description or "",
            "parameters": self.mcp.parameters}}


@dataclass
class Episode:
    """One rollout: the live verifiers task, its State, its toolsets and the executed steps."""

    task_id: str
    task: Any
    state: Any
    bound: dict[str, BoundTool]  # not `tools`: a state's `tools` are offered specs (base.py)
    own: list[Any]  # task-scoped toolsets, closed after scoring
    steps: list[list[tuple[ToolCall, ToolResult]]] = field(default_factory=list)


def bind_tools(toolsets: list[Any]) -> dict[str, BoundTool]:
    """`<server>_<tool>` -> BoundTool, named as verifiers' MCP harnesses name them."""
    from mcp.server.mcpserver.tools.base import Tool as McpTool
    from verifiers.v1.utils.decorators import discover_decorated

    out: dict[str, BoundTool] = {}
    for ts in toolsets:
        for fn in discover_decorated(ts, "tool"):
            raw = getattr(fn, "tool_name", None) or fn.__name__
            name = f"{ts.server_name}_{raw}" if ts.server_name else raw
            if name in out:
                raise CoevoError(f"verifiers: two tools are named {name!r} (give a toolset a "
                                 "distinct TOOL_PREFIX)")
            out[name] = BoundTool(ts, fn, McpTool.from_function(
                fn, name=name, description=(fn.__doc__ or "").strip()))
    return out


def _text(content: Any) -> str:
    from verifiers.v1.types import content_text

    return content_text(content)


def row_id(task: Any) -> str:
    """The row's durable id (module docstring): data.id, an overridden key, a content hash."""
    import verifiers.v1 as vf

    if task.data.id:
        return str(task.data.id)
    if type(task).key is not vf.Task.key:
        return str(task.key)
    data = task.data.model_dump(mode="json", exclude_none=True, exclude={"idx"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def opening_messages(data: Any) -> list[dict[str, Any]]:
    """The row's prompt as coevo messages; the system prompt goes before the first user text."""
    prompt = data.prompt
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = [{"role": m.role, "content": _text(m.content)} for m in prompt or []
                    if m.role != "system"]
    system = "\n\n".join(s for s in [data.system_prompt or ""] + [
        _text(m.content) for m in (prompt if isinstance(prompt, list) else [])
        if m.role == "system"] if s)
    if system:
        first = next((m for m in messages if m["role"] == "user"), None)
        if first is None:
            messages.insert(0, {"role": "user", "content": system})
        else:
            first["content"] = f"{system}\n\n{first['content']}"
    if not messages:
        raise CoevoError("verifiers: a row has no prompt (user-opened conversations need "
                         "verifiers' user simulation, which coevo does not run)")
    return messages


def unsupported(task: Any) -> str | None:
    """Why coevo cannot play this task faithfully (module docstring), or None."""
    import verifiers.v1 as vf

    cls = type(task)
    if cls.NEEDS_CONTAINER:
        return f"{cls.__name__} needs a container"
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(cls, hook) is not getattr(vf.Task, hook):
            return f"{cls.__name__}.{hook} needs a verifiers runtime"
    for kind in ("reward", "metric"):
        for fn in task.hooks(kind):
            p = inspect.signature(fn).parameters.get("runtime")
            if p is not None and p.default is inspect.Parameter.empty:
                return f"{kind} {fn.__name__!r} needs a verifiers runtime"
    if task.config.judges:
        return "judges call a judge model"
    return None


class VerifiersEnv:
    """`verifiers:<factory or taskset id>` (see the module docstring)."""

    def __init__(self, target: str, split: SplitSpec | dict | None = None,
                 limit: int | None = None, call_timeout: float = 30.0, **options: Any):
        vf = import_vf()
        if not target:
            raise CoevoError("verifiers: needs a factory, e.g. verifiers:my_env:load_environment")
        shown = {**options, **({"limit": limit} if limit is not None else {}),
                 **({"call_timeout": call_timeout} if call_timeout != 30.0 else {})}
        self.name = spec_name("verifiers", target, shown)
        self.split = split_field(split)
        self.limit, self.call_timeout = limit, call_timeout
        self.taskset = load_taskset(vf, target, options, self.name)
        task_cls = type(self.taskset).task_type()
        config = self.taskset.config
        self._class_tools = bind_tools(task_cls.toolsets(config.task)
                                       + type(self.taskset).toolsets(config))
        self.single_turn = not self._class_tools
        self._loop = EventLoop(f"coevo-{self.name}")
        self._shared: dict[str, BoundTool] | None = None
        self._lock = threading.Lock()
        self._pool: list[Task] | None = None
        self._rows: dict[str, Any] = {}

    # ------------------------------------------------------------------------------ tasks

    def all_tasks(self) -> list[Task]:
        if self._pool is None:
            view = self.taskset
            if self.limit is not None:
                view = view.take(self.limit)
            elif not view.bounded:
                raise CoevoError(f"{self.name}: the taskset is infinite; give ?limit=N")
            rows = list(view)
            for row in rows[:1]:
                why = unsupported(row)
                if why:
                    raise CoevoError(f"{self.name}: not supported: {why}")
            specs = [t.spec for t in self._class_tools.values()]
            self._rows = {row_id(r): r for r in rows}
            self._pool = [Task(id=row_id(r), env=self.name, family=type(r).__name__,
                               messages=opening_messages(r.data), tools=specs,
                               answer=r.data.model_dump(mode="json", exclude_none=True),
                               metadata={"idx": r.data.idx, "name": r.data.name})
                          for r in rows]
        return self._pool

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return select(self.all_tasks(), split, self.split, n)

    def _row(self, task: Task) -> Any:
        self.all_tasks()
        if task.id not in self._rows:
            raise InfraError(f"{self.name}: no row with id {task.id!r}")
        return self._rows[task.id]

    # ---------------------------------------------------------------------------- episode

    def _shared_tools(self) -> dict[str, BoundTool]:
        with self._lock:
            if self._shared is None:
                servers = type(self.taskset).toolsets(self.taskset.config)
                for ts in servers:
                    self._loop.run(ts.setup())
                self._shared = bind_tools(servers)
            return self._shared

    def start(self, task: Task) -> Episode:
        from verifiers.v1.state import state_cls

        row = self._row(task)
        own = type(row).toolsets(row.config)

        async def prepare() -> None:
            for ts in own:
                await ts.setup()
                await ts.setup_task(row)

        self._loop.run(prepare())
        return Episode(task_id=task.id, task=row, state=state_cls(type(row))(),
                       bound={**self._shared_tools(), **bind_tools(own)}, own=own)

    def step(self, state: Episode, calls: list[ToolCall]) -> list[ToolResult]:
        turn = len(state.steps)
        calls = [c if c.id else c.model_copy(update={"id": f"call_{turn}_{i}"})
                 for i, c in enumerate(calls)]
        results = [self._call(state, c) for c in calls]
        state.steps.append(list(zip(calls, results)))
        return results

    def _call(self, state: Episode, call: ToolCall) -> ToolResult:
        t0 = time.perf_counter()
        bound = state.bound.get(call.name)
        if bound is None:
            known = ", ".join(sorted(state.bound))
            return ToolResult.failed(call.name, f"unknown tool {call.name!r}; available: {known}")
        try:
            text = self._loop.run(_invoke(bound, call.arguments, state.state), self.call_timeout)
        except TimeoutError as e:
            msg = f"{call.name}: {e}"
        except Exception as e:  # bad arguments or the tool raising: the agent sees it
            msg = f"{type(e).__name__}: {e}"
        else:
            return ToolResult(name=call.name, content=text, seconds=time.perf_counter() - t0)
        return ToolResult.failed(call.name, msg, time.perf_counter() - t0)

    # ---------------------------------------------------------------------------- scoring

    def score(self, task: Task, state: Any, response: Response) -> Score:
        from verifiers.v1.errors import TaskError
        from verifiers.v1.state import state_cls

        row = self._row(task)
        if state is not None and (not isinstance(state, Episode) or state.task_id != task.id):
            raise InfraError(f"{task.id}: score needs the Episode that start() returned")
        episode = state or Episode(task.id, row, state_cls(type(row))(), {}, [])
        trace = build_trace(row, episode, response, [t.spec for t in self._class_tools.values()])
        try:
            self._loop.run(row.score(trace))
        except TaskError as e:
            raise InfraError(f"{task.id}: verifiers scoring failed: {e}") from e
        finally:
            self._loop.run(_close(episode.own))
        return to_score(trace)


async def _invoke(bound: BoundTool, arguments: dict[str, Any], state: Any) -> str:
    """Call one tool as verifiers' MCP server would: arguments validated by MCP's metadata,
    the episode's State as `self.state`, the result rendered as MCP text content."""
    from verifiers.v1.mcp.server import _call_state  # the State a tool reads as self.state

    meta = bound.mcp.fn_metadata
    kwargs = meta.validate_arguments(arguments)
    token = _call_state.set(state)
    try:
        if inspect.iscoroutinefunction(bound.fn):
            value = await bound.fn(**kwargs)
        else:  # a thread copies the context, so the tool still sees this episode's State
            value = await asyncio.to_thread(bound.fn, **kwargs)
    finally:
        _call_state.reset(token)
    result = meta.convert_result(value)
    if getattr(result, "is_error", False):
        raise RuntimeError(_blocks_text(result.content))
    return _blocks_text(result.content)


def _blocks_text(blocks: Any) -> str:
    """MCP content blocks as text (verifiers' mcp_content_to_chat_content, text parts)."""
    return "\n".join(getattr(b, "text", None) or str(b) for b in blocks or [])


async def _close(toolsets: list[Any]) -> None:
    for ts in toolsets:
        with contextlib.suppress(Exception):
            await ts._exit_stack.aclose()  # what a toolset's setup registered for teardown


def build_trace(row: Any, episode: Episode, response: Response, specs: list[dict]) -> Any:
    """The coevo rollout as a verifiers Trace: one node per message, in a single branch."""
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.types import (AssistantMessage, SystemMessage, ToolCall as VfCall,
                                    ToolMessage, UserMessage)

    data = row.data
    messages: list[tuple[Any, bool]] = []
    if data.system_prompt:
        messages.append((SystemMessage(content=data.system_prompt), False))
    if isinstance(data.prompt, str):
        messages.append((UserMessage(content=data.prompt), False))
    else:
        messages.extend((m, False) for m in data.prompt or [])

    def calls_of(calls: list[ToolCall]) -> list[Any]:
        return [VfCall(id=c.id or f"call_{i}", name=c.name, arguments=json.dumps(c.arguments))
                for i, c in enumerate(calls)]

    for step in episode.steps:
        messages.append((AssistantMessage(tool_calls=calls_of([c for c, _ in step])), True))
        messages.extend((ToolMessage(tool_call_id=c.id or "", name=c.name, content=r.content),
                         False) for c, r in step)
    final = calls_of(response.tool_calls) or None  # calls of a last turn that never ran
    messages.append((AssistantMessage(content=response.text, tool_calls=final), True))
    trace = vf.Trace(
        task=vf.TraceTask(type=type(row).__name__, data=data, key=row.key, hash=row.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(runtime=SubprocessConfig()), name="coevo",
                           trainable=False),
        state=episode.state,
        tools=[vf.Tool(name=s["function"]["name"], description=s["function"]["description"],
                       parameters=s["function"]["parameters"]) for s in specs])
    trace.nodes = [MessageNode(parent=i - 1 if i else None, message=m, sampled=sampled)
                   for i, (m, sampled) in enumerate(messages)]
    trace.stop("agent_completed")
    trace.ok = True
    return trace


def to_score(trace: Any) -> Score:
    """Score from a scored Trace (module docstring: details, outcome, success)."""
    details = {name: r.score for name, r in trace.rewards.items() if r is not None}
    details.update({f"metric:{name}": v for name, v in trace.metrics.items() if v is not None})
    raw = trace.reward
    outcome = min(1.0, max(0.0, raw))
    info = {"reward": raw,
            "weights": {name: r.weight for name, r in trace.rewards.items() if r is not None},
            "unscored": sorted(n for n, r in {**trace.rewards, **trace.metrics}.items()
                               if r is None)}
    return Score(outcome=outcome, success=outcome >= 1.0, details=details, info=info)


def load_taskset(vf: Any, target: str, options: dict[str, Any], where: str) -> Any:
    """The taskset a spec names: a factory's Taskset / Env, or an installed taskset id."""
    if ":" in target:
        made = import_factory(target, where)(**options)
    else:
        from verifiers.v1.utils.loaders import taskset_config_type

        try:
            config = taskset_config_type(target).model_validate({**options, "id": target})
            made = vf.load_taskset(config)
        except (ImportError, ValueError, TypeError) as e:
            raise CoevoError(f"{where}: {type(e).__name__}: {e}".splitlines()[0]) from None
    if isinstance(made, vf.Env):
        made = made.taskset
    if not isinstance(made, vf.Taskset):
        raise CoevoError(f"{where}: {target} returned {type(made).__name__}, not a verifiers "
                         "Taskset or Env")
    return made
