"""reasoning-gym datasets as coevo environments, with an optional calculator tool.

A pool of `size` entries is generated once with `reasoning_gym.create_dataset(name,
size=size, seed=seed, **kwargs)` and cut into train / val / test by hashing task ids
(`coevo.envs.splits`). Task ids name the dataset, its kwargs, the seed and the index, so the
same spec gives the same ids everywhere. The verifier is the dataset's own
`score_answer(answer, entry)` on `Response.text` (the runtime's extracted final answer); if
the text still carries `<answer>...</answer>` tags, reasoning-gym's own `extract_answer` takes
the last one. Departure: `score_answer`'s partial scores (e.g. 0.2 for a wrong number in
basic_arithmetic) become the outcome as they are, and `success` means outcome == 1.

The calculator (`calculator=True`) evaluates `expression` with `coevo.envs.callparse.
safe_arithmetic`: numbers, + - * / // % ** and parentheses only, bounded in length, node
count, exponent and result size; it is never handed to Python's eval.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from coevo.envs.base import Feedback, Response, Score, Task
from coevo.envs.callparse import safe_arithmetic
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import CoevoError
from coevo.trajectory import ToolCall, ToolResult

MAX_EXPRESSION_CHARS = 200

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression and return its value. Supports numbers, "
            "+ - * / // % ** and parentheses."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "e.g. (12 + 7) * 3 / 2"}
            },
            "required": ["expression"],
        },
    },
}


def calculate(expression: str, max_chars: int = MAX_EXPRESSION_CHARS) -> int | float:
    """The calculator: ValueError with a readable reason for anything but arithmetic.

    >>> calculate("(12 + 7) * 3 / 2")
    28.5
    """
    if not isinstance(expression, str):
        raise ValueError("expression must be a string")
    if len(expression) > max_chars:
        raise ValueError(f"expression longer than {max_chars} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from None
    return safe_arithmetic(tree.body)


def _format_number(x: int | float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def _kwargs_key(kwargs: dict[str, Any]) -> str:
    return "&".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(kwargs.items()))


class ReasoningGymEnv:
    """`rg:<dataset>`: one reasoning-gym dataset; dataset options go in `dataset_kwargs`."""

    def __init__(
        self,
        dataset: str,
        dataset_kwargs: dict[str, Any] | None = None,
        size: int = 600,
        seed: int = 0,
        split: SplitSpec | dict | None = None,
        calculator: bool = False,
    ):
        import reasoning_gym

        self.dataset = dataset
        self.dataset_kwargs = dict(dataset_kwargs or {})
        if size < 1:
            raise CoevoError(f"rg:{dataset}: size must be >= 1, got {size}")
        self.size, self.seed = size, seed
        self.split = split_field(split)
        self.calculator = calculator
        self.single_turn = not calculator
        key = _kwargs_key(self.dataset_kwargs)
        self.name = f"rg:{dataset}" + (f"?{key}" if key else "")
        self._id_prefix = f"{self.name}@{seed}"
        try:
            self._ds = reasoning_gym.create_dataset(dataset, size=size, seed=seed, **self.dataset_kwargs)
        except Exception as e:  # unknown name (ValueError) or bad config (assertion, TypeError)
            known = ", ".join(sorted(_known_datasets()))
            raise CoevoError(f"rg:{dataset}: cannot create dataset ({type(e).__name__}: {e}); known: {known}") from None
        self._pool: list[Task] | None = None

    def all_tasks(self) -> list[Task]:
        if self._pool is None:
            tools = [CALCULATOR_TOOL] if self.calculator else []
            self._pool = [
                Task(
                    id=f"{self._id_prefix}:{i}",
                    env=self.name,
                    family=self.dataset,
                    messages=[{"role": "user", "content": entry["question"]}],
                    tools=tools,
                    answer=entry,  # the whole entry: score_answer needs its metadata
                    metadata={"dataset": self.dataset, "index": i},
                )
                for i, entry in enumerate(self._ds)
            ]
        return self._pool

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return select(self.all_tasks(), split, self.split, n)

    def start(self, task: Task) -> None:
        return None  # stateless: the calculator keeps no memory

    def step(self, state: Any, calls: list[ToolCall]) -> list[ToolResult]:
        return [self._run(c) for c in calls]

    def _run(self, call: ToolCall) -> ToolResult:
        if not self.calculator or call.name != "calculator":
            offered = "calculator" if self.calculator else "none"
            msg = f"unknown tool {call.name!r} (tools offered: {offered})"
            return ToolResult(name=call.name, content=f"Error: {msg}", error=msg)
        try:
            value = calculate(call.arguments.get("expression", ""))
        except ValueError as e:
            return ToolResult(name=call.name, content=f"Error: {e}", error=str(e))
        return ToolResult(name=call.name, content=_format_number(value))

    def score(self, task: Task, state: Any, response: Response) -> Score:
        from reasoning_gym.utils import extract_answer

        entry = task.answer
        text = (response.text or "").strip()
        if "<answer>" in text:
            text = extract_answer(text) or ""
        details = {"answered": float(bool(text)), "exact": float(text == str(entry["answer"]).strip())}
        info: dict[str, Any] = {"extracted": text}
        try:
            raw = self._ds.score_answer(text or None, entry)
        except Exception as e:  # a dataset scorer tripping on odd text: a wrong answer
            raw, info["error"] = 0.0, f"score_answer raised {type(e).__name__}: {e}"
        outcome = min(1.0, max(0.0, float(raw or 0.0)))
        feedback = None if outcome >= 1.0 else answer_feedback(str(entry["answer"]), text,
                                                                info.get("error"))
        return Score(outcome=outcome, success=outcome >= 1.0, details=details, info=info,
                     feedback=feedback)


def answer_feedback(expected: str, given: str, error: str | None = None) -> Feedback:
    """A wrong answer's diagnosis: expected vs given (both shortened), `no_answer` when
    nothing was extracted, `scorer_error` when the dataset's scorer tripped on the text.

    >>> answer_feedback("33", "32").text
    "expected '33', given '32'"
    """
    def cut(x: str) -> str:
        return repr(x if len(x) <= 80 else x[:77] + "...")

    if error:
        return Feedback.of("scorer_error", f"{error}; expected {cut(expected)}, given {cut(given)}")
    if not given:
        return Feedback.of("no_answer", f"no answer was extracted; expected {cut(expected)}")
    return Feedback.of("wrong_answer", f"expected {cut(expected)}, given {cut(given)}")


def _known_datasets() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return list(DATASETS)
