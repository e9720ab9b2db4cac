"""`jsonl:PATH`: a team's own tasks, one JSON object per line.

    {"id": "capital-fr", "prompt": "Capital of France?", "answer": "Paris",
     "verifier": "normalized", "family": "geography"}
    {"messages": [{"role": "user", "content": "Book OSL to FCO"}], "tools": [...],
     "answer": {"name": "search_flights", "arguments": {"route": {"from": "OSL"}}},
     "verifier": "tool_calls"}

Keys: `messages` (chat messages: user / assistant turns before the agent answers) or `prompt`
(a string: one user message); optional `tools` (OpenAI function specs the task offers),
`answer` (the verifier's key, never shown to the agent), `family`, `id`, `verifier` (a name,
or `{"name": ..., options}`), `metadata`. The verifier of a line without one is the file's:
`jsonl:tasks.jsonl?verifier=numeric&tolerance=0.01` (default `exact`); the other query keys
are that verifier's options (coevo/envs/answer_checks.py lists the checks and their options;
a plugin is `pkg.module:function`).

Every line is checked when the file is read (JSON syntax, keys, message roles, tool specs,
an answer the verifier can use, a unique id): a bad line is a CoevoError naming the file, the
line number and the field, and no task is served. A line without `id` gets the first 16 hex
digits of the sha256 of its canonical JSON, so reordering the file moves no task between
splits; splits are hashed from ids (coevo/envs/splits.py) as for every environment.

Tasks are single-turn: the agent's first reply (its text, or its tool calls) is scored; tools
are offered, and the calls are checked, never executed.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from coevo.assets.base import canonical_json, sha256_hex
from coevo.assets.harness import ToolSpec
from coevo.envs.answer_checks import ANSWER_RULES, CHECKS, resolve_check, run_check
from coevo.envs.base import Response, Score, Task
from coevo.envs.splits import SplitSpec, select, split_field
from coevo.errors import AssetError, CoevoError
from coevo.jsonlines import check_unique_ids, read_objects, validate_line
from coevo.trajectory import ToolCall, ToolResult

DEFAULT_VERIFIER = "exact"


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]  # the harness owns the system message
    content: str


class VerifierRef(BaseModel):
    """`"numeric"` or `{"name": "numeric", "tolerance": 0.01}` on a line."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class TaskLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | int | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    prompt: str | None = Field(None, min_length=1)
    tools: list[ToolSpec] = Field(default_factory=list)
    answer: JsonValue = None
    family: str = ""
    verifier: VerifierRef | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_prompt(self) -> "TaskLine":
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give `messages` or `prompt` (exactly one)")
        return self


class JsonlEnv:
    """Tasks from a JSONL file (see the module docstring)."""

    single_turn = True

    def __init__(self, path: str, verifier: str = DEFAULT_VERIFIER,
                 split: SplitSpec | dict | None = None, **options: Any):
        if not path:
            raise CoevoError("jsonl: needs a file, e.g. jsonl:training/data/tasks.jsonl")
        self.path = path
        self.split = split_field(split)
        self.verifier, self.options = verifier, options
        resolve_check(verifier, options, f"jsonl:{path}")  # an unknown name fails before reading
        query = "&".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                         for k, v in sorted({"verifier": verifier, **options}.items())
                         if (k, v) != ("verifier", DEFAULT_VERIFIER))
        self.name = f"jsonl:{path}" + (f"?{query}" if query else "")
        self._pool: list[Task] | None = None

    def all_tasks(self) -> list[Task]:
        if self._pool is None:
            self._pool = load_tasks(self.path, self.name, self.verifier, self.options)
        return self._pool

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        return select(self.all_tasks(), split, self.split, n)

    def start(self, task: Task) -> None:
        return None

    def step(self, state: Any, calls: list[ToolCall]) -> list[ToolResult]:
        msg = "tools of a task file are checked, not executed"
        return [ToolResult(name=c.name, content=f"Error: {msg}", error=msg) for c in calls]

    def score(self, task: Task, state: Any, response: Response) -> Score:
        v = task.metadata["verifier"]
        check = _resolve(v["name"], canonical_json(v["options"]))
        return run_check(check, response, task.answer, v["options"], name=v["name"])


@functools.lru_cache(maxsize=64)
def _resolve(name: str, options_json: str):
    return resolve_check(name, json.loads(options_json), "verifier")


def load_tasks(path: str, env: str, verifier: str = DEFAULT_VERIFIER,
               options: dict[str, Any] | None = None) -> list[Task]:
    """Every task of the file, validated line by line (AssetError `FILE:LINE: field: reason`)."""
    lines = read_objects(path, "task")
    tasks = [_task(data, where, env, verifier, options or {}) for where, data in lines]
    check_unique_ids([(where, t.id) for (where, _), t in zip(lines, tasks)])
    for (where, _), t in zip(lines, tasks):
        t.metadata["line"] = int(where.rsplit(":", 1)[-1])
    return tasks


def _task(data: dict[str, Any], where: str, env: str, verifier: str,
          options: dict[str, Any]) -> Task:
    line = validate_line(TaskLine, data, where)
    ref = line.verifier
    name, opts = (ref.name, ref.options) if ref is not None else (verifier, options)
    field = "verifier" if ref is not None else None
    try:
        resolve_check(name, opts, where)
    except CoevoError as e:
        raise AssetError(where, field, str(e).removeprefix(f"{where}: ")) from None
    if name in CHECKS:
        try:
            ANSWER_RULES[name](line.answer)
        except ValueError as e:
            why = "required field is missing" if "answer" not in data else str(e)
            raise AssetError(where, "answer", f"{why} (verifier {name!r})") from None
    messages = ([m.model_dump() for m in line.messages] if line.messages is not None
                else [{"role": "user", "content": line.prompt}])
    tid = str(line.id) if line.id is not None else sha256_hex(canonical_json(data))[:16]
    return Task(id=tid, env=env, family=line.family, messages=messages,
                tools=[t.model_dump(mode="json", exclude={"sandbox"}) for t in line.tools],
                answer=line.answer,
                metadata={**line.metadata, "verifier": {"name": name, "options": opts}})
