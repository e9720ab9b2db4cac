"""The harness's own tools (not the environment's) and their execution with timeouts.

A harness may offer the policy tools of its own, e.g. a `calculator` or a `python` sandbox,
next to the functions the task's environment offers. They are real tools: the calculator
evaluates arithmetic over a whitelisted AST (no `eval`), and `python` runs code in a separate
interpreter (`python -I`, an empty working folder, a clean environment) with a wall-clock
timeout and rlimits on CPU time, address space, file size and process count.

Every failure mode - unknown tool, arguments that do not match the tool's JSON schema, an
exception in the tool, a timeout - is returned as a `ToolResult` with `error` set: an
observation the policy can react to, never an exception that ends the episode.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import jsonschema

from coevo.registry import Registry
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
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {name: getattr(math, name) for name in (
    "sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
    "floor", "ceil", "factorial", "gcd", "comb", "perm", "hypot", "degrees", "radians")}
_FUNCS.update(abs=abs, round=round, min=min, max=max)
_CONSTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def calculate(expression: str) -> float | int:
    """Evaluate arithmetic without `eval`: numbers, + - * / // % **, math functions.

    >>> calculate("2 * (3 + 4) ** 2")
    98
    >>> calculate("sqrt(16) + pi")
    7.141592653589793
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolFailure(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        # 10**10**10 would hang the worker thread; cap the result size instead.
        if isinstance(node.op, ast.Pow) and abs(right) > 1000 and abs(left) > 1:
            raise ToolFailure("exponent too large")
        try:
            return _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError, ValueError) as exc:
            raise ToolFailure(str(exc)) from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _FUNCS and not node.keywords:
        try:
            return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
        except (TypeError, ValueError, OverflowError) as exc:
            raise ToolFailure(f"{node.func.id}: {exc}") from None
    raise ToolFailure(f"unsupported syntax: {ast.unparse(node)!r}")


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

    def run(self, arguments: dict[str, Any], timeout: float) -> str:
        return repr(calculate(arguments["expression"]))


# -- python sandbox --------------------------------------------------------------------------
def _limits(cpu_s: int, mem_bytes: int) -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))  # no fork bombs


class PythonSandbox:
    """Runs `code` in a fresh interpreter; stdout (and stderr on failure) is the observation."""

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

    def __init__(self, memory_mb: int = 512):
        self.memory_mb = memory_mb

    def run(self, arguments: dict[str, Any], timeout: float) -> str:
        cpu = max(1, math.ceil(timeout))
        with tempfile.TemporaryDirectory(prefix="coevo-py-") as cwd:
            # Own session (process group), so a timeout kills whatever the code spawned too.
            proc = subprocess.Popen(
                [sys.executable, "-I", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, cwd=cwd, start_new_session=True,
                env={"PATH": "/usr/bin:/bin", "HOME": cwd, "PYTHONIOENCODING": "utf-8"},
                preexec_fn=lambda: _limits(cpu, self.memory_mb << 20))
            try:
                stdout, stderr = proc.communicate(arguments["code"], timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise TimeoutError(f"python: no result within {timeout:g}s") from None
        if proc.returncode != 0:
            tail = (stderr or "").strip().splitlines()[-3:]
            raise ToolFailure(f"exit code {proc.returncode}: " + " | ".join(tail))
        return stdout


TOOLS.add("calculator", Calculator())
TOOLS.add("python", PythonSandbox())


def resolve_tools(names: list[str]) -> dict[str, Tool]:
    """name -> Tool for a harness's tool list; an unknown name fails listing the known ones."""
    return {name: TOOLS.get(name) for name in names}


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
        # The thread keeps running if it overshoots (threads cannot be killed); the sandbox
        # enforces its own timeout in the child, so only in-process tools can overshoot.
        out = await asyncio.wait_for(asyncio.to_thread(tool.run, dict(call.arguments), timeout),
                                     timeout + 0.5)
    except (TimeoutError, asyncio.TimeoutError) as exc:
        msg = str(exc) or f"{call.name}: no result within {timeout:g}s"
        return result(f"Error: timeout: {msg}", f"timeout: {msg}")
    except Exception as exc:  # any tool failure is an observation for the policy
        msg = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ToolFailure) else str(exc)
        return result(f"Error: {msg}", msg)
    return result(str(out))
