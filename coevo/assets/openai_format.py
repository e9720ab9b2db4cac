"""A harness as an OpenAI chat-completions request body, and back.

A team that already deploys an agent has it as a request body: a system message, few-shot
user/assistant pairs, `tools` in OpenAI function-calling format and sampling settings. That
maps onto a Harness field by field:

    messages[0] (role system)          system_prompt
    user/assistant pairs after it      demos (a new demo starts at each user message that
                                       follows an assistant message)
    tools                              tools (tool_format "chat_template": the specs go to the
                                       model's chat template, as an OpenAI server does)
    temperature, top_p, top_k (vLLM),  decoding.temperature, .top_p, .top_k, .max_new_tokens,
    max_tokens / max_completion_tokens, .stop
    stop (a string or a list)
    response_format json_schema        decoding.constrain json_schema

Keys that belong to the deployment rather than the harness (`model`, `stream`, `user`, ...)
are left out and reported; a final user message with no reply is the request's task, not
part of the harness, and is left out and reported too. Anything else that a Harness cannot
hold (a second system message, an assistant tool call in a demo, a tool's `strict` flag, a
penalty, `seed`, `n`, a non-default `tool_choice`) is refused with one `file: field: reason`
error: importing it anyway would deploy something other than what was tested.

Export writes the inverse. A harness whose model writes tool calls as text (`tool_format`
json or python) with tools, or whose grammar is not a JSON schema, cannot be expressed as a
request and is refused. Workflow knobs (turn limit, reflection, answer extraction) and skill
activation are the deploying application's loop, not part of one request: export reports the
ones that differ from the defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coevo.assets.harness import Decoding, Harness, SkillActivation, Workflow
from coevo.assets.io import asset_error_from_validation
from coevo.errors import AssetError
from coevo.sandbox import DEFAULT_SANDBOX

# Request keys that configure the deployment (which model, how to stream, who asks), not
# the behaviour a harness fixes; left out on import, with a note.
DEPLOYMENT_KEYS = ("model", "stream", "stream_options", "user", "metadata", "store",
                   "service_tier")
# Request keys whose value is allowed only at the API default (nothing is lost by dropping
# them); any other value is refused.
DEFAULT_ONLY = {"tool_choice": "auto", "parallel_tool_calls": True, "n": 1,
                "presence_penalty": 0, "frequency_penalty": 0}
_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
             "max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
             "stop": "stop"}
_SCHEMA_NAME = "answer"


class Imported(BaseModel):
    """An imported harness and the request parts left out of it (each a `field: why` line)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    harness: Harness
    left_out: list[str] = Field(default_factory=list)


def _text(content: Any, source: str, field: str) -> str:
    """A message's content: a string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, p in enumerate(content):
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise AssetError(source, f"{field}.{i}", f"only text parts can be imported, got {kind!r}")
            parts.append(p["text"])
        return "".join(parts)
    raise AssetError(source, field, f"must be a string or a list of text parts, got {type(content).__name__}")


def _demos(messages: list[Any], source: str, left_out: list[str]) -> tuple[list[dict], dict[str, str]]:
    """Demo dicts from the messages after the system message, and harness path -> request path
    (for errors raised by validation)."""
    demos: list[dict[str, Any]] = []
    paths: dict[str, str] = {}
    end = len(messages)
    if end > 1 and isinstance(messages[-1], dict) and messages[-1].get("role") == "user":
        end -= 1
        left_out.append(f"messages.{end}: the final user message (the request's task, not part "
                        "of the harness)")
    for i in range(1, end):
        m, field = messages[i], f"messages.{i}"
        if not isinstance(m, dict):
            raise AssetError(source, field, f"a message must be an object, got {type(m).__name__}")
        role = m.get("role")
        if role == "system":
            raise AssetError(source, f"{field}.role", "a second system message cannot be "
                             "represented (a harness has one system prompt)")
        if role not in ("user", "assistant"):
            raise AssetError(source, f"{field}.role", f"demos hold user and assistant messages, "
                             f"got {role!r}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise AssetError(source, f"{field}.{extra[0]}", "cannot be represented in a demo "
                             "(demos hold role and text content only)")
        text = _text(m.get("content"), source, f"{field}.content")
        if role == "user" and (not demos or demos[-1]["messages"][-1]["role"] == "assistant"):
            demos.append({"messages": []})
        elif not demos:
            raise AssetError(source, f"{field}.role", "a demo starts with a user message")
        d, k = len(demos) - 1, len(demos[-1]["messages"])
        demos[-1]["messages"].append({"role": role, "content": text})
        paths[f"demos.{d}.messages.{k}"] = field
        paths.setdefault(f"demos.{d}", field)
    return demos, paths


def _decoding(body: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, str]]:
    out: dict[str, Any] = {}
    paths: dict[str, str] = {}
    for key, target in _SAMPLING.items():
        if key not in body or body[key] is None:
            continue
        if target in out:
            raise AssetError(source, key, "give max_tokens or max_completion_tokens, not both")
        value = body[key]
        out[target] = [value] if key == "stop" and isinstance(value, str) else value
        paths[f"decoding.{target}"] = key
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema"
                and isinstance(fmt.get("json_schema"), dict) and "schema" in fmt["json_schema"]):
            raise AssetError(source, "response_format", "only {\"type\": \"json_schema\", "
                             "\"json_schema\": {\"schema\": ...}} can be represented "
                             "(decoding.constrain)")
        out["constrain"] = {"mode": "json_schema", "json_schema": fmt["json_schema"]["schema"]}
        paths["decoding.constrain"] = "response_format.json_schema.schema"
    return out, paths


def harness_from_request(body: Any, name: str, source: str) -> Imported:
    """The Harness a chat-completions request body describes (see the module docstring).
    Raises AssetError naming `source` and the request's field."""
    if not isinstance(body, dict):
        raise AssetError(source, None, f"expected a JSON object (a request body), got {type(body).__name__}")
    left_out = [f"{k}: the deployment's, not the harness's" for k in DEPLOYMENT_KEYS if k in body]
    known = set(DEPLOYMENT_KEYS) | set(DEFAULT_ONLY) | set(_SAMPLING) | {"messages", "tools",
                                                                          "response_format"}
    for key in body:
        if key not in known:
            raise AssetError(source, key, "cannot be represented in a harness")
    for key, default in DEFAULT_ONLY.items():
        if key in body and body[key] != default:
            raise AssetError(source, key, f"only the default {json.dumps(default)} can be "
                             f"represented, got {json.dumps(body[key])}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise AssetError(source, "messages", "a list of messages starting with the system message is required")
    first = messages[0]
    if not isinstance(first, dict) or first.get("role") != "system":
        raise AssetError(source, "messages.0.role", "the first message must be the system message")
    extra = sorted(set(first) - {"role", "content"})
    if extra:
        raise AssetError(source, f"messages.0.{extra[0]}", "cannot be represented in a harness")
    system = _text(first.get("content"), source, "messages.0.content")
    demos, paths = _demos(messages, source, left_out)
    decoding, dpaths = _decoding(body, source)
    tools = body.get("tools") or []
    data = {"name": name, "system_prompt": system, "tools": tools, "tool_format": "chat_template",
            "demos": demos, "decoding": decoding}
    paths |= dpaths | {"system_prompt": "messages.0.content"}
    try:
        return Imported(harness=Harness.model_validate(data), left_out=left_out)
    except ValidationError as e:
        err = asset_error_from_validation(e, source, data, Harness)
        raise AssetError(source, _request_path(err.field, paths), err.reason) from None


def _request_path(field: str | None, paths: dict[str, str]) -> str | None:
    """A harness field path as the request's path (tools keep theirs; name is --name)."""
    if field is None or field.startswith("tools") or field == "name":
        return field if field != "name" else "name (--name)"
    parts = field.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in paths:
            return ".".join([paths[head], *parts[n:]])
    return field


def request_from_harness(h: Harness, source: str) -> tuple[dict[str, Any], list[str]]:
    """The request body that deploys `h`, and the harness settings a request cannot carry
    (`field: value` lines). Raises AssetError for what would change the model's behaviour."""
    if h.tools and h.tool_format != "chat_template":
        raise AssetError(source, "tool_format", f"{h.tool_format!r}: the model writes tool calls "
                         "as text, which an OpenAI tools request cannot express (use chat_template)")
    c = h.decoding.constrain
    if c.mode not in ("none", "json_schema"):
        raise AssetError(source, "decoding.constrain", f"mode {c.mode!r} has no OpenAI request "
                         "equivalent (only json_schema does: response_format)")
    messages: list[dict[str, Any]] = [{"role": "system", "content": h.render_system()}]
    for j, d in enumerate(h.demos):
        for i, m in enumerate(d.messages):
            if m.role == "tool":
                raise AssetError(source, f"demos.{j}.messages.{i}.role",
                                 "a tool message without the assistant's call cannot be exported")
            messages.append({"role": m.role, "content": m.content})
    body: dict[str, Any] = {"messages": messages}
    if h.tools:
        body["tools"] = [_tool(t.model_dump(mode="json", exclude={"sandbox"})) for t in h.tools]
    dec, default = h.decoding, Decoding()
    body |= {"temperature": dec.temperature, "top_p": dec.top_p, "max_tokens": dec.max_new_tokens}
    if dec.top_k != default.top_k:
        body["top_k"] = dec.top_k
    if dec.stop:
        body["stop"] = list(dec.stop)
    if c.mode == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": _SCHEMA_NAME, "schema": c.json_schema}}
    return body, _not_in_request(h)


def _tool(spec: dict[str, Any]) -> dict[str, Any]:
    # An empty description is what an absent one means; leave it out as the request did.
    if not spec["function"].get("description"):
        spec["function"].pop("description", None)
    return spec


def _not_in_request(h: Harness) -> list[str]:
    notes = []
    for field, value, default in (("workflow", h.workflow, Workflow()),
                                  ("skills", h.skills, SkillActivation())):
        now, base = value.model_dump(mode="json"), default.model_dump(mode="json")
        notes += [f"{field}.{k}: {json.dumps(now[k])}" for k in now if now[k] != base[k]]
    if any(t.sandbox != DEFAULT_SANDBOX for t in h.tools):
        notes.append("tools.*.sandbox: the deploying application runs the tools")
    sel = h.demo_selection
    if sel.select == "retrieve":
        notes.append(f"demo_selection: retrieve {sel.k} per task from a pool of {len(sel.pool)} "
                     "(one request carries the static demos only)")
    return notes


def read_request(path: str | Path) -> Any:
    """A JSON file's content; any problem -> AssetError naming the file (and line)."""
    source = str(path)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AssetError(source, None, "no such file") from None
    except json.JSONDecodeError as e:
        raise AssetError(source, None, f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AssetError(source, None, f"cannot read: {e}") from None


__all__ = ["Imported", "harness_from_request", "read_request", "request_from_harness"]
