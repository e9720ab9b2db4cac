"""Constrained decoding: what a completion must match, carried on a `Request`.

A `Constraint` is kept in its source form, because every backend speaks a different dialect
of the same idea, and a trained token must be replayable against exactly what constrained it:

| kind          | llguidance (hf, embedded, trainer) | vLLM                    | OpenAI-compatible            | llama.cpp          |
| ------------- | ---------------------------------- | ----------------------- | ---------------------------- | ------------------ |
| `json_schema` | `grammar_from_json_schema`         | structured `json`       | `response_format` json_schema | `LlamaGrammar.from_json_schema` |
| `lark`        | `grammar_from_lark`                | structured `grammar`    | vLLM `structured_outputs`     | unsupported (error) |
| `regex`       | `grammar_from_regex`               | structured `regex`      | vLLM `structured_outputs`     | unsupported (error) |

The grammar engine is llguidance (the one llama.cpp and vLLM use); coevo never writes token
masking logic of its own: backends wire the engine's bitmask into their sampling loop
(coevo/models/masks.py). A constraint that cannot be honoured - a schema keyword the engine
does not implement, a backend without grammar support - raises `UnsupportedConstraint` (or
fails that request with its message), never a silent fall back to unconstrained sampling.

JSON is compiled without flexible whitespace (`{"a":1}`, as measured in FACTS.md): a small
model offered free whitespace can pad forever.

This module needs neither torch nor llguidance to import; llguidance is imported when a
grammar is compiled.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coevo.errors import CoevoError

Kind = Literal["json_schema", "lark", "regex"]

# llguidance JSON compile options (see its JsonCompileOptions).
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}


class UnsupportedConstraint(CoevoError, ValueError):
    """A constraint the grammar engine or the backend cannot enforce (the message says which
    part and why). Raised instead of sampling without it."""


class Constraint(BaseModel):
    """One completion's grammar: a JSON Schema, an llguidance Lark grammar or a regex (the
    whole completion must match). `text` is the grammar's source; for a JSON Schema it is the
    schema's JSON text, kept as text because property order is part of the grammar (the
    engine writes properties in the order declared) and a JSON column may reorder keys.
    `source` names where the constraint came from, for error messages."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Kind
    text: str = Field(min_length=1)
    source: str = ""

    @model_validator(mode="after")
    def _json_body(self) -> "Constraint":
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
            except ValueError as e:
                raise ValueError(f"json_schema constraint: text is not JSON ({e})") from None
            if not isinstance(schema, dict):
                raise ValueError("json_schema constraint: the schema must be a JSON object")
        return self

    @classmethod
    def of_json_schema(cls, schema: dict[str, Any], source: str = "") -> "Constraint":
        return cls(kind="json_schema", text=json.dumps(schema, ensure_ascii=False),
                   source=source)

    @classmethod
    def of_lark(cls, grammar: str, source: str = "") -> "Constraint":
        return cls(kind="lark", text=grammar, source=source)

    @classmethod
    def of_regex(cls, pattern: str, source: str = "") -> "Constraint":
        return cls(kind="regex", text=pattern, source=source)

    @property
    def json_schema(self) -> dict[str, Any] | None:
        return json.loads(self.text) if self.kind == "json_schema" else None

    @property
    def key(self) -> str:
        """sha256 of kind + text (`source` is a label, not content)."""
        return hashlib.sha256(f"{self.kind}\n{self.text}".encode()).hexdigest()

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's serialized form (what `LLMatcher` takes)."""
        return _grammar(self.kind, self.text)

    def check(self) -> None:
        """Raise `UnsupportedConstraint` unless llguidance compiles this grammar."""
        error = _validate(self.kind, self.text)
        if error:
            where = f"{self.source}: " if self.source else ""
            raise UnsupportedConstraint(f"{where}{self.kind} constraint: {error}")


def _llg():
    try:
        import llguidance
    except ImportError as e:  # a declared dependency: a broken install, said plainly
        raise UnsupportedConstraint(
            f"constrained decoding needs the llguidance package ({e}); pip install llguidance"
        ) from None
    return llguidance


@functools.lru_cache(maxsize=256)
def _grammar(kind: str, body: str) -> str:
    M = _llg().LLMatcher
    if kind == "json_schema":
        return M.grammar_from_json_schema(body, defaults=dict(JSON_OPTIONS))
    if kind == "lark":
        return M.grammar_from_lark(body)
    return M.grammar_from_regex(body)


@functools.lru_cache(maxsize=256)
def _validate(kind: str, body: str) -> str:
    M = _llg().LLMatcher
    try:
        grammar = _grammar(kind, body)
    except ValueError as e:
        return str(e)
    is_error, messages = M.validate_grammar_with_warnings(grammar, None)
    if is_error:
        return _first_line(messages[0] if messages else "invalid grammar")
    return ""


def _first_line(message: str) -> str:
    text = " ".join(message.split("<state>")[0].split())
    return text[:400]
