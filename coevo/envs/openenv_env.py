"""`openenv:pkg.module:Factory`: an OpenEnv (`openenv-core` 0.3) environment run in-process,
reset / step through coevo's tool-calling runtime.

- spec: `openenv:pkg.module:Factory?key=value` imports `Factory` (an OpenEnv `Environment`
  subclass, or any callable returning a fresh instance) and calls it with the options that are
  not the adapter's own, once for the task prompts and once per episode (each episode has
  its own instance, as OpenEnv's server gives each session one). Adapter options: `seeds`
  (N tasks: `reset(seed=i)` for i < N, default 20), or `resets` (a JSON list of `reset`
  keyword sets, one task each); `reward` (`sum`, default, or `last`); `step_timeout`
  (seconds, passed to `step` as `timeout_s`, default 30); `split` (coevo/envs/splits.py).
- Task: one per reset. `id` is `reset` + the canonical JSON of its keywords (`reset{"seed":0}`),
  so splits depend on the keywords only. `messages`: one user message, the observation that
  `reset` returns, as JSON of its fields without `done`, `reward` and `metadata`. `tools`:
  for an `MCPEnvironment`, the tools its `ListToolsAction` lists (name, description, input
  schema); otherwise one tool, `step`, whose parameters are the JSON schema of the
  environment's action class (read from `Environment[MyAction, ...]`, `metadata` left out).
- Tool calls: a call to a listed MCP tool is `step(CallToolAction(...))` and its result text
  (or its error) is the tool result; a `step` call validates the arguments into the action
  class (a validation error is an error result and steps nothing) and the next observation,
  rendered like the first, is the result. After an observation with `done`, further calls
  are error results: the episode's world is over.
- Score: the rewards the observations carried (the environment's rubric, when its `step`
  applies one): `Score.outcome` is their sum (or the last one) clipped to [0, 1], raw value
  and the list in `info`; `success` is outcome == 1. `Score.details`: `steps`, `done` (1/0),
  and when the environment has a `rubric`, its `last_score` as `rubric` and every named
  child's as `rubric.<name>` (a `WeightedSum`'s parts, say). The final answer text is not
  sent to the environment (an environment that wants an answer offers a tool for it); it is
  kept in `info`.

Not supported: OpenEnv clients over HTTP / WebSocket or Docker (the environment runs in
coevo's process); `reset_async` / `step_async` overrides (the sync API is called, from the
runtime's worker threads); an MCP environment's non-MCP actions (`_step_impl`); messages a
`Transform` adds beyond the observation fields. Trajectory rubrics work as the environment
wires them: their score arrives on the step's observation.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from coevo.assets.base import canonical_json
from coevo.envs.base import Response, Score, Task
from coevo.envs.registry import import_factory, spec_name
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall, ToolResult

STEP_TOOL = "step"
INSTALL = ("pip install 'coevo[openenv]' && pip install --no-deps openenv-core==0.3.0 "
           "(see requirements-nodeps.txt)")
_HIDDEN = {"done", "reward", "metadata"}


def import_openenv() -> Any:
    """`openenv.core`, or one CoevoError line saying how to install it."""
    try:
        import openenv.core as core
    except ImportError:
        raise CoevoError(f"openenv: environments need the openenv-core package: {INSTALL}") from None
    return core


def observation_text(obs: Any) -> str:
    """An observation's own fields as JSON (what the agent reads)."""
    return json.dumps(obs.model_dump(mode="json", exclude=_HIDDEN), ensure_ascii=False)


def action_class(env_cls: type) -> type:
    """The `ActT` of `Environment[ActT, ObsT, StateT]` somewhere in the class's bases."""
    from openenv.core import Action

    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            for arg in typing.get_args(base)[:1]:
                if isinstance(arg, type) and issubclass(arg, Action):
                    return arg
    raise CoevoError(f"openenv: {env_cls.__name__} does not name its action class; declare "
                     "it as Environment[MyAction, MyObservation, MyState]")


def step_spec(action: type) -> dict[str, Any]:
    """The `step` tool: the action class's JSON schema, without OpenEnv's `metadata`."""
    schema = action.model_json_schema()
    schema.get("properties", {}).pop("metadata", None)
    if "required" in schema:
        schema["required"] = [r for r in schema["required"] if r != "metadata"]
    doc = (action.__doc__ or "").strip()
    return {"type": "function", "function": {
        "name": STEP_TOOL, "description": doc or "Take one action in the environment.",
        "parameters": schema}}


def _tool_text(obs: Any) -> tuple[str, str | None]:
    """(text, error) of a CallToolObservation: MCP text content joined, or the error."""
    if obs.error is not None:
        return f"Error: {obs.error.message}", obs.error.message
    result = obs.result
    blocks = getattr(result, "content", None)
    if blocks is not None:
        return "\n".join(getattr(b, "text", None) or str(b) for b in blocks), None
    return (result if isinstance(result, str) else json.dumps(result, default=str)), None


@dataclass
class Episode:
    task_id: str
    env: Any
    done: bool = False
    rewards: list[float] = field(default_factory=list)
    steps: int = 0


class OpenEnvEnv:
    """`openenv:pkg.module:Factory` (see the module docstring)."""

    single_turn = False  # the agent acts through tool calls, one step each

    def __init__(self, target: str, split: SplitSpec | dict | None = None, seeds: int = 20,
                 resets: list[dict[str, Any]] | None = None,
                 reward: Literal["sum", "last"] = "sum", step_timeout: float = 30.0,
                 **options: Any):
        self.core = import_openenv()
        own = {"seeds": seeds} if resets is None else {"resets": resets}
        defaults = {"reward": "sum", "step_timeout": 30.0}
        own.update({k: v for k, v in (("reward", reward), ("step_timeout", step_timeout))
                    if v != defaults[k]})
        self.name = spec_name("openenv", target, {**options, **own})
        if reward not in ("sum", "last"):
            raise CoevoError(f"{self.name}: reward must be sum or last, got {reward!r}")
        if resets is None and (not isinstance(seeds, int) or seeds < 1):
            raise CoevoError(f"{self.name}: seeds must be an integer >= 1, got {seeds!r}")
        if resets is not None and not (isinstance(resets, list) and resets
                                       and all(isinstance(r, dict) for r in resets)):
            raise CoevoError(f"{self.name}: resets must be a non-empty JSON list of objects")
        self.factory = import_factory(target, self.name)
        self.options, self.reward, self.step_timeout = options, reward, step_timeout
        self.resets = resets if resets is not None else [{"seed": i} for i in range(seeds)]
        self.split = split_field(split)
        probe = self._make()
        mcp_cls = self.core.MCPEnvironment  # None when fastmcp is missing
        self.mcp = mcp_cls is not None and isinstance(probe, mcp_cls)
        self.action = None if self.mcp else action_class(type(probe))
        self._probe = probe
        self._pool: list[Task] | None = None

    def _make(self) -> Any:
        try:
            env = self.factory(**self.options)
        except TypeError as e:
            raise CoevoError(f"{self.name}: {e}") from None
        if not isinstance(env, self.core.Environment):
            raise CoevoError(f"{self.name}: the factory returned {type(env).__name__}, not an "
                             "OpenEnv Environment")
        return env

    # ------------------------------------------------------------------------------ tasks

    def _tools(self) -> list[dict[str, Any]]:
        if not self.mcp:
            return [step_spec(self.action)]
        listed = self._probe.step(self.core.ListToolsAction())
        return [{"type": "function", "function": {
            "name": t.name, "description": t.description or "", "parameters": t.input_schema}}
            for t in listed.tools]

    def all_tasks(self) -> list[Task]:
        if self._pool is None:
            tools, pool = self._tools(), []
            for kwargs in self.resets:
                obs = self._probe.reset(**kwargs)
                pool.append(Task(id=f"reset{canonical_json(kwargs)}", env=self.name,
                                 family=type(self._probe).__name__,
                                 messages=[{"role": "user", "content": observation_text(obs)}],
                                 tools=tools, metadata={"reset": kwargs}))
            with contextlib.suppress(Exception):
                self._probe.close()
            self._pool = pool
        return self._pool

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return select(self.all_tasks(), split, self.split, n)

    # ---------------------------------------------------------------------------- episode

    def start(self, task: Task) -> Episode:
        env = self._make()
        obs = env.reset(**task.metadata["reset"])
        ep = Episode(task_id=task.id, env=env, done=bool(obs.done))
        if obs.reward is not None:
            ep.rewards.append(float(obs.reward))
        return ep

    def step(self, state: Episode, calls: list[ToolCall]) -> list[ToolResult]:
        return [self._one(state, c) for c in calls]

    def _one(self, ep: Episode, call: ToolCall) -> ToolResult:
        t0 = time.perf_counter()
        if ep.done:
            return ToolResult.failed(call.name, "the episode is over (the environment said done)")
        if self.mcp:
            action = self.core.CallToolAction(tool_name=call.name, arguments=call.arguments)
        elif call.name != STEP_TOOL:
            return ToolResult.failed(call.name, f"unknown tool {call.name!r}; available: {STEP_TOOL}")
        else:
            try:
                action = self.action.model_validate(call.arguments)
            except ValueError as e:  # pydantic's ValidationError: name the fields at fault
                return ToolResult.failed(call.name, re.sub(r"\s+", " ", f"bad action: {e}"))
        try:
            obs = ep.env.step(action, timeout_s=self.step_timeout)
        except Exception as e:  # the environment rejecting an action is the agent's to see
            return ToolResult.failed(call.name, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        ep.steps += 1
        ep.done = bool(obs.done)
        if obs.reward is not None:
            ep.rewards.append(float(obs.reward))
        text, error = (_tool_text(obs) if isinstance(obs, self.core.CallToolObservation)
                       else (observation_text(obs), None))
        return ToolResult(name=call.name, content=text, error=error,
                          seconds=time.perf_counter() - t0)

    # ---------------------------------------------------------------------------- scoring

    def score(self, task: Task, state: Any, response: Response) -> Score:
        if not isinstance(state, Episode) or state.task_id != task.id:
            raise InfraError(f"{task.id}: score needs the Episode that start() returned")
        rewards = state.rewards
        raw = (sum(rewards) if self.reward == "sum" else rewards[-1]) if rewards else 0.0
        outcome = min(1.0, max(0.0, raw))
        details = {"steps": float(state.steps), "done": float(state.done)}
        rubric = getattr(state.env, "rubric", None)
        if rubric is not None:
            parts = [("rubric", rubric), *((f"rubric.{n}", r) for n, r in rubric.named_rubrics())]
            details.update({name: float(r.last_score) for name, r in parts
                            if isinstance(r.last_score, (int, float))})
        with contextlib.suppress(Exception):
            state.env.close()
        return Score(outcome=outcome, success=outcome >= 1.0, details=details,
                     info={"reward": raw, "rewards": rewards, "answer": response.text})
