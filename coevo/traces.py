"""Imported production traces: a team's own transcripts as evidence for the proposers.

`coevo traces import FILE.jsonl --env SPEC` reads one OpenAI chat-format conversation per line:

    {"messages": [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}],
     "tools": [...], "outcome": 0.0, "feedback": "wrong airport", "id": "ticket-4711"}

and stores each as a Trajectory with `split = "imported"` (IMPORTED), no run, no round, no
evaluation, no token ids, `trainable = False`. That one value keeps them out of everything
that decides: the RL stage and its sampler read a run's train trajectories, the gate and
evaluation read their own evaluations' trajectories, and `coevo.rl.batch.to_sample` refuses an
imported trajectory outright. What reads them is the proposers: the loop adds the newest
`IMPORTED_CAP` imported traces of the run's environment to each round's ProposalContext, and
the LLM proposers' digest shows them in their own fenced section, next to the round's own
episodes.

Where the fields go (no schema change): `outcome` (0..1) -> Trajectory.outcome, success when
it is 1; `feedback` -> a final message with role "feedback", `tools` -> a first message with
role "tools" (the specs as JSON): neither is a chat role, so neither can be mistaken for part
of the conversation. A line without `id` gets a content hash; importing the same file twice
stores nothing new. A bad line stops the import with `FILE:LINE: field: reason`, and nothing
is stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from coevo.assets.base import canonical_json, sha256_hex
from coevo.assets.harness import ToolSpec
from coevo.jsonlines import check_unique_ids, read_objects, validate_line
from coevo.trajectory import Trajectory

IMPORTED = "imported"  # Trajectory.split of an imported trace
IMPORTED_CAP = 32  # imported traces a proposer context holds (the newest)


class ChatMessage(BaseModel):
    """An OpenAI chat message (content may be null next to tool calls)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, JsonValue]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, JsonValue]] | None = None
    tool_call_id: str | None = None


class TraceLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | int | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] = Field(default_factory=list)
    outcome: float | None = Field(None, ge=0.0, le=1.0)
    feedback: str | None = None


def _content(m: ChatMessage) -> str:
    if isinstance(m.content, list):  # text parts joined; other parts named
        return "".join(str(p.get("text", f"[{p.get('type')}]")) for p in m.content)
    return m.content or ""


def _message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": _content(m)}
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
    for key in ("name", "tool_call_id"):
        if getattr(m, key):
            out[key] = getattr(m, key)
    return out


def trace_from_line(data: dict[str, Any], where: str, env: str) -> Trajectory:
    line = validate_line(TraceLine, data, where)
    messages = [_message(m) for m in line.messages]
    if line.tools:  # validated above, kept as the team wrote them
        messages.insert(0, {"role": "tools", "content": json.dumps(data["tools"], ensure_ascii=False)})
    if line.feedback:
        messages.append({"role": "feedback", "content": line.feedback})
    answer = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), None)
    tid = str(line.id) if line.id is not None else sha256_hex(canonical_json(data))[:16]
    return Trajectory(id=sha256_hex(f"{env}\n{tid}")[:32], env=env, task_id=tid, split=IMPORTED,
                      messages=messages, trainable=False, answer=answer, outcome=line.outcome,
                      success=line.outcome is not None and line.outcome >= 1.0, model=IMPORTED)


def read_traces(path: str | Path, env: str) -> list[Trajectory]:
    """Every trace of the file, validated line by line (AssetError `FILE:LINE: field: reason`)."""
    lines = read_objects(path, "trace")
    out = [trace_from_line(data, where, env) for where, data in lines]
    check_unique_ids([(where, t.task_id) for (where, _), t in zip(lines, out)])
    return out


def import_traces(store: Any, path: str | Path, env: str) -> tuple[int, int]:
    """Store the file's traces for `env` (an environment's name); (new, already stored)."""
    trajs = read_traces(path, env)
    have = {t.id for t in store.trajectories(ids=[t.id for t in trajs])}
    new = [t for t in trajs if t.id not in have]
    store.add_trajectories(new)
    return len(new), len(have)


def imported_traces(store: Any, env: str, cap: int = IMPORTED_CAP) -> list[Trajectory]:
    """The newest `cap` imported traces of `env`, oldest first."""
    found = store.trajectories(split=IMPORTED, env=env)
    return found[-cap:] if cap > 0 else []
