"""The harness's own tools (not the environment's) and their execution with timeouts.

A harness may offer the policy tools of its own, e.g. a `calculator` or a `python` sandbox,
next to the functions the task's environment offers. They are real tools: the calculator
evaluates arithmetic over a whitelisted AST (no `eval`) in a worker process that is killed on
timeout (coevo/agent/calculator.py), and `python` runs code in a fresh interpreter inside a
sandbox (coevo/sandbox.py: bubblewrap, no network, a private tmpfs, read-only system folders,
its own PID namespace killed as a whole on timeout, rlimits on CPU time, address space, file
size and process count). Without a usable sandbox the `python` tool refuses to run code,
unless the harness opted out with the unsafe `sandbox: none` on that tool.

Every failure mode - unknown tool, arguments that do not match the tool's JSON schema, an
exception in the tool, a timeout - is returned as a `ToolResult` with `error` set: an
observation the policy can react to, never an exception that ends the episode.
"""

from __future__ import annotations

import asyncio
import math
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import jsonschema

from coevo.agent.calculator import CalcError, WorkerPool
from coevo.errors import CoevoError
from coevo.registry import Registry
from coevo.sandbox import DEFAULT_SANDBOX, SANDBOXES, Limits, Sandbox, SandboxTimeout, interpreter_paths
from coevo.trajectory import ToolCall, ToolResult

DEFAULT_TIMEOUT_S = 5.0
MAX_OUTPUT_CHARS = 4000  # what an observation may add to the context


class ToolFailure(Exception):
    """A tool ran and failed in a way it can explain (the message becomes the observation)."""


@runtime_checkable
class Tool(Protocol):
    """Contract:
    - `spec` is an OpenAI function spec `{"name", "description", "parameters"}` whose
      `parameters` is valid JSON Schema; arguments are validated against it before `run`.
    - `run(arguments, timeout)` returns the observation text. It may raise (any exception
      becomes an error observation); it should honour `timeout` itself when it can kill its
      work (a subprocess); otherwise the runner stops waiting after `timeout` seconds.
    """

    name: str
    spec: dict[str, Any]

    def run(self, arguments: dict[str, Any], timeout: float) -> str: ...


TOOLS: Registry[Tool] = Registry("harness tool")


def function_name(spec: dict[str, Any]) -> str:
    """The name in an OpenAI function spec, bare or wrapped.

    >>> function_name({"type": "function", "function": {"name": "f"}})
    'f'
    >>> function_name({"name": "g", "parameters": {}})
    'g'
    """
    inner = spec.get("function", spec) if isinstance(spec.get("function"), dict) else spec
    return str(inner.get("name", ""))


def _parameters(spec: dict[str, Any]) -> dict[str, Any]:
    inner = spec["function"] if isinstance(spec.get("function"), dict) else spec
    return inner.get("parameters") or {"type": "object", "properties": {}}


# -- calculator ------------------------------------------------------------------------------
class Calculator:
    name = "calculator"
    spec = {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % **, sqrt, log, sin, "
                       "pi, ...) and return the number.",
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string",
                                                     "description": "e.g. '2 * (3 + 4)'"}},
                       "required": ["expression"], "additionalProperties": False},
    }

    def __init__(self) -> None:
        self.workers = WorkerPool()

    def run(self, arguments: dict[str, Any], timeout: float) -> str:
        # In a worker process, killed on timeout: a thread would go on computing.
        try:
            return self.workers.evaluate(arguments["expression"], timeout)
        except CalcError as exc:
            raise ToolFailure(str(exc)) from None


# -- python ------------------------------------------------------------------------------------
# What the exit signal of a killed program means, for the observation.
_SIGNALS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "output or file size limit",
            signal.SIGKILL: "killed (CPU or memory limit)"}


class PythonTool:
    """Runs `code` in a fresh interpreter (`python -I`) inside a sandbox (coevo/sandbox.py,
    `bwrap` unless the harness opts out with the unsafe `sandbox: none`); stdout (and the
    stderr tail on failure) is the observation. When the sandbox is unavailable the tool
    refuses: the observation says which sandbox is missing, and no code runs."""

    name = "python"
    spec = {
        "name": "python",
        "description": "Run Python 3 code in a fresh sandboxed interpreter and return what it "
                       "prints. No network, no files kept between calls.",
        "parameters": {"type": "object",
                       "properties": {"code": {"type": "string",
                                               "description": "a complete program; use print"}},
                       "required": ["code"], "additionalProperties": False},
    }

    def __init__(self, sandbox: str = DEFAULT_SANDBOX, memory_mb: int = 512):
        self.sandbox: Sandbox = SANDBOXES.get(sandbox)
        self.memory_mb = memory_mb

    def with_sandbox(self, sandbox: str) -> "PythonTool":
        return PythonTool(sandbox, self.memory_mb)

    def run(self, arguments: dict[str, Any], timeout: float) -> str:
        problem = self.sandbox.problem()
        if problem is not None:
            raise ToolFailure(f"python: sandbox {self.sandbox.name!r} unavailable, code not run: "
                              f"{problem}")
        limits = Limits(cpu_s=max(1, math.ceil(timeout)), memory_mb=self.memory_mb)
        try:
            done = self.sandbox.run([sys.executable, "-I", "-"], arguments["code"], timeout,
                                    limits, readable=interpreter_paths())
        except SandboxTimeout:
            raise TimeoutError(f"python: no result within {timeout:g}s") from None
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-3:]
            why = _SIGNALS.get(-done.returncode) if done.returncode < 0 else None
            head = f"exit code {done.returncode}" + (f" ({why})" if why else "")
            raise ToolFailure(head + (": " + " | ".join(tail) if tail else ""))
        return done.stdout


TOOLS.add("calculator", Calculator())
TOOLS.add("python", PythonTool())


def resolve_tools(names: Sequence[str], sandboxes: Mapping[str, str] | None = None
                  ) -> dict[str, Tool]:
    """name -> Tool for a harness's tool list; an unknown name fails listing the known ones.
    `sandboxes` maps a tool name to the sandbox its code runs in (`ToolSpec.sandbox`); only a
    tool that runs code (has `with_sandbox`) takes a setting other than the default."""
    out: dict[str, Tool] = {}
    for name in names:
        tool = TOOLS.get(name)
        kind = (sandboxes or {}).get(name, DEFAULT_SANDBOX)
        if kind != DEFAULT_SANDBOX:
            if not hasattr(tool, "with_sandbox"):
                raise CoevoError(f"tool {name!r} runs no code: it takes no `sandbox` setting")
            tool = tool.with_sandbox(kind)
        out[name] = tool
    return out


def validate_arguments(spec: dict[str, Any], arguments: Any) -> str | None:
    """None if `arguments` match the spec's JSON schema, else a one-line reason.

    >>> validate_arguments(Calculator.spec, {"expression": "1+1"}) is None
    True
    >>> validate_arguments(Calculator.spec, {"expr": "1+1"})
    "bad arguments: 'expression' is a required property"
    """
    try:
        jsonschema.validate(arguments, _parameters(spec))
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"bad arguments{' at ' + where if where else ''}: {exc.message}"
    except jsonschema.SchemaError as exc:
        return f"tool spec is not valid JSON Schema: {exc.message}"
    return None


def _clip(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS] + f"\n... [{len(text) - MAX_OUTPUT_CHARS} chars cut]"


async def execute(call: ToolCall, tools: Mapping[str, Tool],
                  timeout: float = DEFAULT_TIMEOUT_S) -> ToolResult:
    """Run one call; every failure becomes `ToolResult(error=...)`, never an exception."""
    t0 = time.perf_counter()

    def result(content: str, error: str | None = None) -> ToolResult:
        return ToolResult(name=call.name, content=_clip(content), error=error,
                          seconds=time.perf_counter() - t0)

    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "(none)"
        msg = f"unknown tool {call.name!r}; available: {known}"
        return result(f"Error: {msg}", msg)
    bad = validate_arguments(tool.spec, call.arguments)
    if bad:
        return result(f"Error: {bad}", bad)
    try:
        # Both built-in tools kill their work at `timeout` themselves (a worker process, the
        # sandbox's process group); the margin only bounds a plugin tool that computes in
        # this thread, which keeps running after it (threads cannot be killed).
        out = await asyncio.wait_for(asyncio.to_thread(tool.run, dict(call.arguments), timeout),
                                     timeout + 0.5)
    except (TimeoutError, asyncio.TimeoutError) as exc:
        msg = str(exc) or f"{call.name}: no result within {timeout:g}s"
        return result(f"Error: timeout: {msg}", f"timeout: {msg}")
    except Exception as exc:  # any tool failure is an observation for the policy
        msg = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ToolFailure) else str(exc)
        return result(f"Error: {msg}", msg)
    return result(str(out))
