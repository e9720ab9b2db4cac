"""The calculator tool's arithmetic: a whitelisted-AST evaluator, run in killable workers.

`calculate(expression)` parses the expression and walks the tree, allowing only numbers,
+ - * / // % **, unary signs, a few math functions and constants (no `eval`, no names, no
attributes). A single allowed call can still run for minutes (`factorial(10**7)`), and a
Python thread cannot be stopped, so the tool evaluates in a worker process instead
(`WorkerPool`): `python -I` running this file, which reads one JSON line per expression and
answers one JSON line. A worker that overruns the timeout is SIGKILLed and replaced; idle
workers are reused (a new one costs about 20 ms). This file imports only the standard library,
so a worker starts fast and needs nothing of coevo.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

WORKER_MEMORY_BYTES = 512 << 20  # what one evaluation may allocate
MAX_IDLE_WORKERS = 4


class CalcError(Exception):
    """The expression is not allowed or cannot be computed (the message is the observation)."""


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
        raise CalcError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        # 10**10**10 would exhaust memory before any timeout; cap the exponent instead.
        if isinstance(node.op, ast.Pow) and abs(right) > 1000 and abs(left) > 1:
            raise CalcError("exponent too large")
        try:
            return _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError, ValueError) as exc:
            raise CalcError(str(exc)) from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _FUNCS and not node.keywords:
        try:
            return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
        except (TypeError, ValueError, OverflowError) as exc:
            raise CalcError(f"{node.func.id}: {exc}") from None
    raise CalcError(f"unsupported syntax: {ast.unparse(node)!r}")


def answer(expression: str) -> dict[str, str]:
    """One worker reply: {"value": repr} or {"error": message}.

    >>> answer("1 / 0")
    {'error': 'division by zero'}
    """
    try:
        return {"value": repr(calculate(expression))}
    except CalcError as exc:
        return {"error": str(exc)}
    except (MemoryError, RecursionError, ValueError) as exc:  # a huge result, deep nesting
        return {"error": f"{type(exc).__name__}: {exc}"}


def serve() -> None:
    """The worker loop: one JSON line in ({"expression": ...}), one JSON line out; ends at EOF
    (the parent closed the pipe or died)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    for line in sys.stdin:
        try:
            expression = json.loads(line)["expression"]
            reply = answer(str(expression))
        except (ValueError, KeyError, TypeError) as exc:
            reply = {"error": f"bad request: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class _Worker:
    def __init__(self) -> None:
        # Own session: a kill reaches the worker even if a future change makes it spawn.
        self.proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def ask(self, expression: str, timeout: float) -> dict[str, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"expression": expression}) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, timeout))
        if not ready:
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise CalcError(f"the computation died (exit code {code}; memory limit?)")
        return json.loads(line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()

    @property
    def pid(self) -> int:
        return self.proc.pid


class WorkerPool:
    """Idle calculator workers, reused; a call takes one (or starts one), so concurrent calls
    never wait for each other. A worker that timed out or failed is killed, never reused."""

    def __init__(self, max_idle: int = MAX_IDLE_WORKERS):
        self.max_idle = max_idle
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def evaluate(self, expression: str, timeout: float) -> str:
        """repr of the value; CalcError with the reason; TimeoutError after `timeout` s (the
        worker is dead by the time it is raised)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None or worker.proc.poll() is not None:
            worker = _Worker()
        try:
            reply = worker.ask(expression, deadline - time.monotonic())
        except TimeoutError:
            worker.kill()
            raise TimeoutError(f"calculator: no result within {timeout:g}s") from None
        except BaseException:
            worker.kill()
            raise
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(worker)
                worker = None
        if worker is not None:
            worker.kill()
        if "error" in reply:
            raise CalcError(reply["error"])
        return reply["value"]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


if __name__ == "__main__":
    serve()
