"""BFCL multi-turn categories: tool calls executed against BFCL's simulated APIs.

`start()` instantiates the entry's classes from BFCL's `multi_turn_eval/func_source_code`
(file system, messaging, trading, travel, vehicle, ...) and loads the entry's initial
configuration into each (`_load_scenario`), as BFCL's `execute_multi_turn_func_call` does.
`step()` runs each call as a method of the class that defines it; an unknown function, bad
arguments, an exception or a timeout comes back as a `ToolResult` with `error` set (an
observation for the agent, not an infrastructure failure).

Turns. An entry has several user turns. `Task.messages` holds the first one and
`Task.metadata["turns"]` all of them. The runtime advances: when the agent answers without a
tool call, it calls `env.next_turn(state)` and appends the returned messages to the
conversation; `None` means the episode is over. In `multi_turn_miss_func`, a turn may make
held-out functions available: `next_turn` adds them to `state.tools` (the runtime should
offer `state.tools` from then on) and returns BFCL's "I have updated some more functions"
user message, as BFCL's function-calling handler does.

Scoring: BFCL's own `multi_turn_checker`, given the executed call history (per turn, per
step) rendered as BFCL call strings. The checker replays those calls on fresh instances and,
after every turn, compares instance state and execution results with the ground truth's
(its state check and response check). Departures:
- Only calls to methods of the entry's classes, with identifier argument names and JSON
  argument values, are handed over: the checker `eval`s call strings, so anything else would
  be code execution on model output. A dropped call could only have been an error result.
- The checker caches instances in its module globals under `model_name + entry id`; each
  score uses a fresh name and removes its globals afterwards, so repeated scoring of one
  entry never reuses a stale instance.
- `details` (partial credit, ours): turns_reached, calls_ok (executed calls without error),
  turns_with_calls (of the turns whose ground truth has calls), state_match (classes whose
  final state equals the state after all ground-truth calls).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
import keyword
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from coevo.envs.base import Response, Score, Task
from coevo.envs.bfcl import bfcl_modules, checker_feedback, load_entries, to_openai_tool
from coevo.envs.callparse import ParseError, python_call_parts, python_call_text
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import CoevoError, InfraError
from coevo.trajectory import ToolCall, ToolResult

MULTI_TURN_CATEGORIES = (
    "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context",
)
ADDED_FUNCTIONS_MESSAGE = "I have updated some more functions you can choose from. What about now?"


@dataclass
class MultiTurnState:
    """One episode's simulated world and its call history (turn -> step -> calls)."""

    task_id: str
    instances: dict[str, Any]
    owner: dict[str, str]  # method name -> class name
    turns: list[list[dict[str, Any]]]
    tools: list[dict[str, Any]]
    missed: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    turn: int = 0
    history: list[list[list[ToolCall]]] = field(default_factory=lambda: [[]])
    results: list[ToolResult] = field(default_factory=list)


@functools.lru_cache(maxsize=None)
def _api_class(name: str) -> type:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    bfcl_modules()  # the import shim must be in place first
    if name not in CLASS_FILE_PATH_MAPPING:
        raise InfraError(f"BFCL has no simulated API class {name!r}")
    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)


def _public_methods(cls: type) -> list[str]:
    return [n for n, v in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")]


def _json_value(v: Any) -> bool:
    if v is None or isinstance(v, (str, bool, int, float)):
        return True
    if isinstance(v, list):
        return all(_json_value(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_value(x) for k, x in v.items())
    return False


def _safe_args(args: dict[str, Any]) -> bool:
    return all(k.isidentifier() and not keyword.iskeyword(k) and _json_value(v) for k, v in args.items())


def _result_text(value: Any) -> str:
    """BFCL's rendering of a result: strings as they are, dicts as JSON, the rest str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _run_with_timeout(fn, kwargs: dict[str, Any], timeout: float) -> tuple[Any, BaseException | None, bool]:
    """(value, exception, timed_out). A daemon thread: a call that never returns is left
    behind (Python cannot kill a thread) but the episode goes on."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(**kwargs)
        except BaseException as e:  # noqa: BLE001 - the agent sees every failure as an error
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return None, None, True
    return box.get("value"), box.get("error"), False


class BFCLMultiEnv:
    """`bfcl-multi:<category>` for BFCL's multi-turn categories."""

    single_turn = False

    def __init__(self, category: str, split: SplitSpec | dict | None = None,
                 limit: int | None = None, call_timeout: float = 5.0):
        if category not in MULTI_TURN_CATEGORIES:
            raise CoevoError(
                f"bfcl-multi: unknown multi-turn category {category!r}; known: "
                f"{', '.join(MULTI_TURN_CATEGORIES)}"
            )
        self.category = category
        self.name = f"bfcl-multi:{category}"
        self.split = split_field(split)
        self.limit = limit
        self.call_timeout = call_timeout
        self._pool: list[Task] | None = None

    # ------------------------------------------------------------------------------ tasks

    def all_tasks(self) -> list[Task]:
        if self._pool is None:
            entries, answers = load_entries(self.category)
            entries = entries[: self.limit] if self.limit is not None else entries
            self._pool = [self._task(e, answers[e["id"]]) for e in entries]
        return self._pool

    def _task(self, entry: dict, answer: list[list[str]]) -> Task:
        turns = entry["question"]
        missed = {k: [to_openai_tool(f) for f in v] for k, v in entry.get("missed_function", {}).items()}
        return Task(
            id=entry["id"],
            env=self.name,
            family=self.category,
            messages=turns[0],
            tools=[to_openai_tool(f) for f in entry["function"]],
            answer=answer,  # ground-truth call strings, per turn
            metadata={
                "turns": turns,
                "initial_config": entry["initial_config"],
                "involved_classes": entry["involved_classes"],
                "missed_function": missed,
            },
        )

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return select(self.all_tasks(), split, self.split, n)

    # ---------------------------------------------------------------------------- episode

    def _instances(self, task: Task) -> tuple[dict[str, Any], dict[str, str]]:
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        instances, owner = {}, {}
        config = task.metadata["initial_config"]
        for name in task.metadata["involved_classes"]:
            obj = _api_class(name)()
            if name not in STATELESS_CLASSES:
                obj._load_scenario(copy.deepcopy(config.get(name, {})),
                                   long_context="long_context" in self.category)
            instances[name] = obj
            for method in _public_methods(type(obj)):
                owner[method] = name
        return instances, owner

    def start(self, task: Task) -> MultiTurnState:
        instances, owner = self._instances(task)
        return MultiTurnState(
            task_id=task.id, instances=instances, owner=owner,
            turns=task.metadata["turns"], tools=list(task.tools),
            missed=task.metadata.get("missed_function", {}),
        )

    def next_turn(self, state: MultiTurnState) -> list[dict[str, Any]] | None:
        """Advance to the next user turn: its messages, or None when all turns are done."""
        if state.turn + 1 >= len(state.turns):
            return None
        state.turn += 1
        state.history.append([])
        added = state.missed.get(str(state.turn))
        if added:
            state.tools.extend(added)
        messages = list(state.turns[state.turn])
        if added and not messages:
            messages = [{"role": "user", "content": ADDED_FUNCTIONS_MESSAGE}]
        return messages

    def step(self, state: MultiTurnState, calls: list[ToolCall]) -> list[ToolResult]:
        # Copies: the simulated APIs keep argument objects (a tweet's `mentions` list) and
        # mutate them later, which would rewrite the recorded history.
        state.history[state.turn].append([c.model_copy(deep=True) for c in calls])
        results = [self._execute(state, c) for c in calls]
        state.results.extend(results)
        return results

    def _execute(self, state: MultiTurnState, call: ToolCall) -> ToolResult:
        t0 = time.perf_counter()

        def fail(msg: str) -> ToolResult:
            return ToolResult(name=call.name, content=f"Error: {msg}", error=msg,
                              seconds=time.perf_counter() - t0)

        cls = state.owner.get(call.name)
        if cls is None:
            return fail(f"unknown function {call.name!r}")
        method = getattr(state.instances[cls], call.name)
        try:
            inspect.signature(method).bind(**call.arguments)
        except TypeError as e:
            return fail(f"bad arguments for {call.name}: {e}")
        kwargs = copy.deepcopy(call.arguments)
        value, exc, timed_out = _run_with_timeout(method, kwargs, self.call_timeout)
        if timed_out:
            return fail(f"{call.name} timed out after {self.call_timeout:g} s")
        if exc is not None:
            return fail(f"{type(exc).__name__}: {exc}")
        text = _result_text(value)
        # The simulated APIs report misuse as {"error": ...}; keep it visible as an error.
        err = value.get("error") if isinstance(value, dict) and isinstance(value.get("error"), str) else None
        return ToolResult(name=call.name, content=text, error=err, seconds=time.perf_counter() - t0)

    # ---------------------------------------------------------------------------- scoring

    def ground_truth_calls(self, task: Task) -> list[list[ToolCall]]:
        """The ground-truth call strings of each turn as ToolCalls (positional arguments
        named through the method's signature): a reference episode."""
        owner = {m: c for c in task.metadata["involved_classes"] for m in _public_methods(_api_class(c))}
        out = []
        for turn in task.answer:
            calls = []
            for text in turn:
                try:
                    ((name, pos, kw),) = python_call_parts(text)
                except (ParseError, ValueError) as e:
                    raise InfraError(f"{task.id}: unreadable ground truth {text!r}: {e}") from None
                if pos:
                    params = [p for p in inspect.signature(getattr(_api_class(owner[name]), name)).parameters
                              if p != "self"]
                    kw = {**dict(zip(params, pos)), **kw}
                calls.append(ToolCall(name=name, arguments=kw))
            out.append(calls)
        return out

    def _decoded(self, state: MultiTurnState) -> tuple[list[list[list[str]]], int]:
        decoded, dropped = [], 0
        for turn in state.history:
            steps = []
            for calls in turn:
                ok = [c for c in calls if c.name in state.owner and _safe_args(c.arguments)]
                dropped += len(calls) - len(ok)
                if ok:  # BFCL skips steps that decode to nothing
                    steps.append([python_call_text(c.name, c.arguments) for c in ok])
            decoded.append(steps)
        return decoded, dropped

    def score(self, task: Task, state: Any, response: Response) -> Score:
        if not isinstance(state, MultiTurnState) or state.task_id != task.id:
            raise InfraError(f"{task.id}: score needs the MultiTurnState that start() returned")
        m = bfcl_modules()
        gt: list[list[str]] = task.answer
        decoded, dropped = self._decoded(state)
        details = self._partial_credit(task, state, gt)
        info: dict[str, Any] = {"decoded": decoded, "dropped_calls": dropped}
        if len(decoded) != len(gt):
            info["error"] = f"episode reached {len(decoded)} of {len(gt)} turns"
            info["error_type"] = "multi_turn:force_terminated"
            return Score(outcome=0.0, success=False, details=details, info=info,
                         feedback=checker_feedback(info))
        entry = {"id": task.id, "initial_config": task.metadata["initial_config"],
                 "involved_classes": task.metadata["involved_classes"]}
        model_name = f"coevo_{uuid.uuid4().hex}"
        try:
            result = m.mt_checker.multi_turn_checker(decoded, gt, entry, self.category, model_name)
        except Exception as e:  # the checker's own asserts: the verifier could not run
            raise InfraError(f"{task.id}: BFCL multi-turn checker failed: {type(e).__name__}: {e}") from e
        finally:
            _forget(m.mt_utils, model_name)
        ok = bool(result.get("valid"))
        if not ok:
            info["error"] = result.get("error_message")
            info["error_type"] = result.get("error_type")
        return Score(outcome=float(ok), success=ok, details=details, info=info,
                     feedback=None if ok else checker_feedback(info))

    def _partial_credit(self, task: Task, state: MultiTurnState, gt: list[list[str]]) -> dict[str, float]:
        executed = state.results
        wanted = [i for i, t in enumerate(gt) if t]
        made = [i for i in wanted if i < len(state.history) and any(state.history[i])]
        d = {
            "turns_reached": len(state.history) / len(gt) if gt else 1.0,
            "calls_ok": (sum(r.error is None for r in executed) / len(executed)) if executed else 0.0,
            "turns_with_calls": len(made) / len(wanted) if wanted else 1.0,
        }
        reference = self.start(task)
        for turn in self.ground_truth_calls(task):
            for call in turn:
                self._execute(reference, call)
        compare = bfcl_modules().mt_checker._compare_instances
        same = [compare(state.instances[c], reference.instances[c])[0] for c in state.instances]
        d["state_match"] = sum(same) / len(same) if same else 1.0
        return d


def _forget(module: Any, prefix: str) -> None:
    """Drop the instances BFCL's executor cached in its module globals under `prefix`."""
    for key in [k for k in vars(module) if k.startswith(prefix)]:
        delattr(module, key)
