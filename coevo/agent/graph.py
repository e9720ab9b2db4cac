"""The harness as a LangGraph state machine: policy -> tools -> (reflect) -> policy ... -> finish.

One compiled graph per harness workflow (cached); an episode is one `ainvoke` with its own
`EpisodeContext` passed as LangGraph's run context (the per-episode mutable part: the token
sequence, the environment state, the turns so far). The graph state itself only carries the
control flow (turn counter and the route chosen), so the compiled graph is shared by every
concurrent episode.

- policy: builds the request from the token sequence (context.py), awaits the backend (through
  the DynamicBatcher, so concurrent episodes share batched calls), records the turn, parses
  tool calls in the harness's declared format (envs/callparse.py).
- tools: environment functions go to `env.step`, the harness's own tools to agent/tools.py;
  unknown names, unreadable calls, bad arguments, exceptions and timeouts become observations.
- reflect (only when the workflow asks for it): after a tool error, a user message with the
  harness's reflection prompt joins the observation.
- user: environments with several user turns (BFCL multi-turn) hand over the next user
  message through `env.next_turn(state)` when the agent answers without a tool call; the
  episode ends when there is none. Text games (TextArena) take every such reply as a move
  through `env.act(state, text)`, the last turn's reply included, and answer with the next
  user message until the game is over.
- finish: answer extraction per harness, into the `Response` the verifier scores.

Departure from a ReAct loop such as langgraph.prebuilt's: a `single_turn` environment scores
the first response as the answer (BFCL single-turn: calls are scored, not executed), and a
backend error ends the episode as missing data (status "infra_error"), never as a zero score.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from coevo.agent.context import TokenSequence
from coevo.agent.tools import Tool, execute, function_name
from coevo.envs.base import Environment, Response, Task
from coevo.envs.callparse import parse_tool_calls
from coevo.models.base import Completion, Request, Sampling
from coevo.models.constrain import Constraint, UnsupportedConstraint
from coevo.trajectory import ToolCall, ToolResult, Turn, TurnSampling

Generate = Callable[[Request], Awaitable[Completion]]

DEFAULT_REFLECTION = ("The last tool call failed (see the error above). Think about why, then "
                      "call the tool again with corrected arguments or answer directly.")


@dataclass
class EpisodeContext:
    """Everything one episode's nodes read and write besides the control-flow state."""

    env: Environment
    task: Task
    seq: TokenSequence
    generate: Generate
    sampling: Sampling
    tool_format: str
    max_turns: int
    # harness.workflow.answer_extraction.extract: final text -> answer (None: none found)
    extract: Callable[[str], str | None] = str.strip
    reflection_prompt: str = DEFAULT_REFLECTION
    tools: dict[str, Tool] = field(default_factory=dict)  # the harness's own tools
    env_state: Any = None
    tool_timeout: float = 5.0
    # The grammar of a turn offering these tool specs (None: free text); see Harness.constraint.
    constrain: Callable[[list[dict[str, Any]]], Constraint | None] | None = None
    turns: list[Turn] = field(default_factory=list)
    error: str | None = None  # set on a backend failure: the episode is infra_error
    response: Response | None = None
    answer: str | None = None
    trainable: bool = True
    seconds_generate: float = 0.0
    seconds_tools: float = 0.0
    pending_user: list[dict[str, Any]] = field(default_factory=list)

    @property
    def env_specs(self) -> list[dict[str, Any]]:
        # Functions revealed mid-episode (BFCL miss_func) live on the environment's state.
        return list(getattr(self.env_state, "tools", None) or self.task.tools)

    @property
    def env_functions(self) -> set[str]:
        return {function_name(spec) for spec in self.env_specs}


class GraphState(TypedDict):
    turn: int  # policy steps taken
    route: Literal["tools", "user", "finish", ""]
    tool_error: bool  # the last tools step produced an error observation


# -- nodes ------------------------------------------------------------------------------------
async def policy_node(state: GraphState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    ep = runtime.context
    try:
        constraint = ep.constrain(ep.env_specs) if ep.constrain is not None else None
    except UnsupportedConstraint as exc:  # named, recorded; never sampled unconstrained
        ep.error = f"constraint: {exc}"
        return {"route": "finish", "turn": state["turn"] + 1}
    request = ep.seq.request(ep.sampling, constraint)
    t0 = time.perf_counter()
    completion = await ep.generate(request)
    seconds = time.perf_counter() - t0
    ep.seconds_generate += seconds
    if completion.finish_reason == "error":
        ep.error = completion.error or "backend returned an error completion"
        return {"route": "finish", "turn": state["turn"] + 1}
    if not completion.trainable:
        ep.trainable = False
    start, end = ep.seq.add_completion(completion)
    parsed = parse_tool_calls(completion.text, ep.tool_format)
    s = ep.sampling
    ep.turns.append(Turn(index=len(ep.turns), start=start, end=end, text=completion.text,
                         finish_reason=completion.finish_reason, tool_calls=parsed.calls,
                         parse_error=parsed.error, seconds=seconds, constraint=constraint,
                         sampling=TurnSampling(temperature=s.temperature, top_k=s.top_k,
                                               top_p=s.top_p)))
    turn = state["turn"] + 1
    attempted = bool(parsed.calls) or parsed.error is not None
    if ep.env.single_turn:
        return {"route": "finish", "turn": turn}
    if hasattr(ep.env, "act") and not (attempted and (ep.env_specs or ep.tools)):
        return await _move(ep, completion.text, turn)
    if turn >= ep.max_turns:
        return {"route": "finish", "turn": turn}
    if not attempted:
        ep.pending_user = _next_user_turn(ep)
        return {"route": "user" if ep.pending_user else "finish", "turn": turn}
    return {"route": "tools", "turn": turn}


async def _move(ep: EpisodeContext, text: str, turn: int) -> dict[str, Any]:
    """A text game: the reply is the move; the game's answer is the next user turn (the last
    turn's reply is played too, so the game sees every move the policy made)."""
    try:
        answer = await asyncio.to_thread(ep.env.act, ep.env_state, text)
    except Exception as exc:  # the game itself failed: missing data, never a lost game
        ep.error = f"environment: {type(exc).__name__}: {exc}"
        return {"route": "finish", "turn": turn}
    ep.pending_user = list(answer or [])
    more = bool(ep.pending_user) and turn < ep.max_turns
    return {"route": "user" if more else "finish", "turn": turn}


def _next_user_turn(ep: EpisodeContext) -> list[dict[str, Any]]:
    """The environment's next user messages (empty: the conversation is over)."""
    next_turn = getattr(ep.env, "next_turn", None)
    if next_turn is None:
        return []
    return list(next_turn(ep.env_state) or [])


async def user_node(state: GraphState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    ep = runtime.context
    ep.seq.add_observation(ep.pending_user)  # mask 0: the user's words, not the policy's
    ep.pending_user = []
    return {"tool_error": False}


async def tools_node(state: GraphState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    ep = runtime.context
    last = ep.turns[-1]
    t0 = time.perf_counter()
    results = await _run_calls(ep, last.tool_calls)
    observation: list[dict[str, Any]] = [
        {"role": "tool", "name": r.name, "content": r.content} for r in results]
    if last.parse_error:
        # Some calls (or none) could not be read: say so, in the same observation.
        observation.append({"role": "user", "content": (
            f"Error: your tool call could not be parsed ({last.parse_error}). "
            f"Write it in the {ep.tool_format} format described above.")})
    last.tool_results = results
    ep.seconds_tools += time.perf_counter() - t0
    ep.seq.add_observation(observation)
    return {"tool_error": bool(last.parse_error) or any(r.error for r in results)}


async def reflect_node(state: GraphState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    ep = runtime.context
    ep.seq.add_observation([{"role": "user", "content": ep.reflection_prompt}])
    return {"tool_error": False}


async def finish_node(state: GraphState, runtime: Runtime[EpisodeContext]) -> dict[str, Any]:
    ep = runtime.context
    if ep.error is not None:
        return {"route": "finish"}
    last = ep.turns[-1]
    ep.answer = ep.extract(last.text)
    ep.response = Response(
        text=ep.answer or "", tool_calls=list(last.tool_calls),
        all_tool_calls=[list(t.tool_calls) for t in ep.turns], parse_error=last.parse_error)
    return {"route": "finish"}


async def _run_calls(ep: EpisodeContext, calls: list[ToolCall]) -> list[ToolResult]:
    """Results in call order: env functions batched into one env.step, harness tools
    concurrently, unknown names answered with the list of what exists."""
    env_names = ep.env_functions
    results: list[ToolResult | None] = [None] * len(calls)
    env_idx = [i for i, c in enumerate(calls) if c.name in env_names]
    own = [(i, c) for i, c in enumerate(calls) if c.name not in env_names and c.name in ep.tools]
    for i, c in enumerate(calls):
        if c.name not in env_names and c.name not in ep.tools:
            known = ", ".join(sorted(env_names | set(ep.tools))) or "(none)"
            msg = f"unknown tool {c.name!r}; available: {known}"
            results[i] = ToolResult(name=c.name, content=f"Error: {msg}", error=msg)
    if env_idx:
        for i, r in zip(env_idx, await _env_step(ep, [calls[i] for i in env_idx])):
            results[i] = r
    if own:
        done = await asyncio.gather(*(execute(c, ep.tools, ep.tool_timeout) for _, c in own))
        for (i, _), r in zip(own, done):
            results[i] = r
    return [r for r in results if r is not None]


async def _env_step(ep: EpisodeContext, calls: list[ToolCall]) -> list[ToolResult]:
    t0 = time.perf_counter()
    try:
        out = await asyncio.wait_for(asyncio.to_thread(ep.env.step, ep.env_state, calls),
                                     ep.tool_timeout * max(1, len(calls)))
    except (TimeoutError, asyncio.TimeoutError):
        msg = f"timeout: the environment gave no result within {ep.tool_timeout:g}s per call"
        return [ToolResult(name=c.name, content=f"Error: {msg}", error=msg,
                           seconds=time.perf_counter() - t0) for c in calls]
    except Exception as exc:  # an env function raising is the policy's problem to see
        msg = f"{type(exc).__name__}: {exc}"
        return [ToolResult(name=c.name, content=f"Error: {msg}", error=msg,
                           seconds=time.perf_counter() - t0) for c in calls]
    out = list(out)
    if len(out) != len(calls):  # a contract breach by the env, reported per call
        msg = f"environment returned {len(out)} results for {len(calls)} calls"
        return [ToolResult(name=c.name, content=f"Error: {msg}", error=msg) for c in calls]
    return out


# -- routing and compilation --------------------------------------------------------------------
def _after_policy(state: GraphState) -> str:
    return state["route"] or "finish"


def _after_tools_reflecting(state: GraphState) -> str:
    return "reflect" if state["tool_error"] else "policy"


_COMPILED: dict[bool, Any] = {}


def build_graph(reflect_on_tool_error: bool):
    """The compiled workflow; the only structural knob is whether a reflect node exists."""
    if reflect_on_tool_error in _COMPILED:
        return _COMPILED[reflect_on_tool_error]
    g = StateGraph(GraphState, context_schema=EpisodeContext)
    g.add_node("policy", policy_node)
    g.add_node("tools", tools_node)
    g.add_node("user", user_node)
    g.add_node("finish", finish_node)
    g.add_edge(START, "policy")
    g.add_conditional_edges("policy", _after_policy,
                            {"tools": "tools", "user": "user", "finish": "finish"})
    g.add_edge("user", "policy")
    if reflect_on_tool_error:
        g.add_node("reflect", reflect_node)
        g.add_conditional_edges("tools", _after_tools_reflecting,
                                {"reflect": "reflect", "policy": "policy"})
        g.add_edge("reflect", "policy")
    else:
        g.add_edge("tools", "policy")
    g.add_edge("finish", END)
    _COMPILED[reflect_on_tool_error] = compiled = g.compile()
    return compiled


async def run_graph(ep: EpisodeContext, reflect_on_tool_error: bool = False) -> EpisodeContext:
    graph = build_graph(reflect_on_tool_error)
    # Each turn visits at most policy, tools, reflect: bound the recursion by the turn limit.
    limit = 4 * ep.max_turns + 4
    await graph.ainvoke({"turn": 0, "route": "", "tool_error": False}, context=ep,
                        config={"recursion_limit": limit})
    return ep
