"""Grammars of tool calls, built per task from the functions it offers.

`tool_call_constraint(specs, fmt, max_calls, allow_text)` returns the `Constraint` that makes
every completion a well-formed call of an offered function, in the harness's tool-call format
(coevo/envs/callparse.py reads the same three formats):

- `json`: a JSON Schema. One call is `{"name": <const>, "arguments": <that function's
  parameter schema>}`, one `anyOf` branch per function; with `max_calls` > 1 the completion is
  a list of 1..max_calls calls. Argument objects get `additionalProperties: false` (no unknown
  keys) recursively wherever properties are declared; required keys stay required.
- `python`: BFCL's prompting format `[f(a=1, b="x")]`, as an llguidance Lark grammar: one rule
  per function with its keyword arguments in declaration order (required ones mandatory,
  optional ones optional), values as Python literals of the parameter's JSON type (strings in
  double quotes, `True`/`False`/`None`, lists, dicts), enums and consts as the listed literals.
- `chat_template`: `<tool_call>\\n{json}\\n</tool_call>` blocks (the json call schema inside a
  Lark grammar via `%json`).

`allow_text` adds a plain-text alternative (for environments where answering without a call
is right, e.g. BFCL irrelevance, or multi-turn episodes that end a user turn in prose): any text
that does not start like a call.

Departure, python format: value assertions of JSON Schema (minimum / maximum, string length,
pattern, format, multipleOf) are not encoded in the Lark grammar - it enforces names, keys,
required keys, types, enums, consts and item counts, and the verifier judges values. Keywords
that change structure and cannot be expressed (not, if/then/else, allOf, $ref,
patternProperties, dependent*, prefixItems, contains, uniqueItems) raise
`UnsupportedConstraint` naming the function and the keyword. The json format hands the whole
schema to llguidance, which enforces what it implements and names what it does not.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from coevo.models.constrain import Constraint, UnsupportedConstraint

# Annotations: dropped before compiling (they only lengthen the grammar).
_ANNOTATIONS = ("description", "default", "title", "examples", "optional", "$comment")
_UNSUPPORTED_PY = ("not", "if", "then", "else", "allOf", "$ref", "$defs", "definitions",
                   "patternProperties", "dependentRequired", "dependentSchemas",
                   "dependencies", "prefixItems", "contains", "uniqueItems",
                   "propertyNames", "unevaluatedProperties", "unevaluatedItems")
MAX_CALLS = 16


def _function(spec: dict[str, Any]) -> dict[str, Any]:
    fn = spec.get("function", spec) if isinstance(spec, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise UnsupportedConstraint(f"not a function spec: {json.dumps(spec)[:200]}")
    return fn


def clean_schema(schema: Any, closed: bool = True) -> Any:
    """A copy without annotations; with `closed`, every object schema that declares
    properties gets `additionalProperties: false` unless it says otherwise, and `required`
    keeps only declared keys (a required key that is not declared could never be written
    under a closed object).

    >>> clean_schema({"type": "object", "description": "d", "required": ["a", "zz"],
    ...               "properties": {"a": {"type": "integer", "default": 1}}})
    {'type': 'object', 'required': ['a'], 'properties': {'a': {'type': 'integer'}}, 'additionalProperties': False}
    """
    def close(node: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in node.items() if k not in _ANNOTATIONS}
        props = out.get("properties")
        if isinstance(props, dict):
            if isinstance(out.get("required"), list):
                out["required"] = [r for r in out["required"] if r in props]
            if closed:
                out.setdefault("additionalProperties", False)
        return out

    # allOf members are left as written: closing one would refuse the other members' keys
    return _walk(copy.deepcopy(schema), close, _SUBSCHEMAS - {"allOf"})


_SUBSCHEMAS = frozenset({"items", "additionalProperties", "anyOf", "oneOf", "allOf"})


def _walk(schema: Any, visit: Any, keys: frozenset[str] = _SUBSCHEMAS) -> Any:
    """A copy of `schema` with `visit(node)` applied to every sub-schema (the values of
    `properties` and of `keys`), inner ones first."""
    if isinstance(schema, list):
        return [_walk(s, visit, keys) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "properties" and isinstance(v, dict):
            out[k] = {p: _walk(x, visit, keys) for p, x in v.items()}
        elif k in keys and isinstance(v, (dict, list)):
            out[k] = _walk(v, visit, keys)
        else:
            out[k] = v
    return visit(out)


def _is_free_string(node: dict[str, Any], cap: int | None = None) -> bool:
    """A string a model can write on and on: no pattern, format or choices, and no
    maxLength (or, with `cap`, one above it)."""
    kind = node.get("type")
    if not (kind == "string" or (isinstance(kind, list) and "string" in kind)):
        return False
    if {"enum", "const", "pattern", "format"} & set(node):
        return False
    return "maxLength" not in node or (cap is not None and node["maxLength"] > cap)


def _is_open_object(node: dict[str, Any]) -> bool:
    """An object of free keys (`dict[str, X]`): as many keys as a model writes."""
    return node.get("type") == "object" and not node.get("properties") and \
        node.get("additionalProperties", True) is not False and "maxProperties" not in node


SCALAR = ["string", "number", "boolean", "null"]


def bound_strings(schema: Any, max_tokens: int, max_items: int = 8) -> Any:
    """The schema bounded so a complete answer fits in about `max_tokens`: every free string
    capped (`maxLength`), every array `maxItems`, and every free-key object given scalar values
    and at most `max_items` keys (free values: scalars only). The strings share the tokens left after about 6 per key, at
    one character per token (what a model looping on digits writes), at least 16 each.

    A grammar only says what may come next; it cannot make a small model stop. A model that
    loops inside a string ("12345678...") or nests objects in a free-key object
    ({"type": {"type": ...) runs into max_tokens with the JSON still open and the answer is
    lost; bounded, the grammar closes the string or object and moves on to the next key.

    >>> bound_strings({"type": "object", "properties": {"a": {"type": "string"},
    ...     "b": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}, 100)["properties"]
    {'a': {'type': 'string', 'maxLength': 44}, 'b': {'anyOf': [{'type': 'string', 'maxLength': 44}, {'type': 'null'}]}}
    """
    slots: list[int] = []
    keys: list[int] = []

    def count(n: dict[str, Any]) -> dict[str, Any]:
        keys.append(len(n.get("properties") or {}))
        if _is_free_string(n):
            slots.append(1)
        elif _is_open_object(n):
            slots.append(2)
            keys.append(2)
        return n

    _walk(schema, count)
    per = max(16, (max_tokens - 6 * sum(keys)) // max(sum(slots), 1))

    def cap(node: dict[str, Any]) -> dict[str, Any]:
        if _is_open_object(node):
            # any value (`True`): scalars only, or objects would nest without end
            values = node.get("additionalProperties", True)
            if values is True:
                values = {"type": SCALAR, "maxLength": per}
            return {**node, "additionalProperties": values, "maxProperties": max_items}
        if _is_free_string(node, per):
            return {**node, "maxLength": per}
        if node.get("type") == "array" and "maxItems" not in node:
            return {**node, "maxItems": max_items}
        return node

    return _walk(schema, cap)


def call_schema(fn: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of one call of `fn`: name fixed, arguments per its parameters."""
    params = clean_schema(fn.get("parameters") or {"type": "object", "properties": {}})
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    params.setdefault("additionalProperties", False)
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def calls_json_schema(specs: Sequence[dict[str, Any]], max_calls: int = 1) -> dict[str, Any]:
    """The json tool-call format's schema: one call object, or a list of 1..max_calls."""
    branches = [call_schema(_function(s)) for s in specs]
    one = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if max_calls == 1:
        return one
    return {"type": "array", "items": one, "minItems": 1, "maxItems": max_calls}


def tool_call_constraint(specs: Sequence[dict[str, Any]], fmt: str, max_calls: int = 1,
                         allow_text: bool = False, source: str = "",
                         copy_from: str | None = None) -> Constraint:
    """The constraint for a turn that offers `specs` (OpenAI function specs) in format `fmt`
    (json | python | chat_template); see the module docstring. Raises UnsupportedConstraint
    for no functions, an unknown format or a schema the format cannot express. `copy_from`
    (python format only): free string values must be spans of that text."""
    if not specs:
        raise UnsupportedConstraint(f"{source or 'tool_calls'}: no functions are offered, so "
                                    "there is no call to constrain to")
    if not 1 <= max_calls <= MAX_CALLS:
        raise UnsupportedConstraint(f"max_calls must be in 1..{MAX_CALLS}, got {max_calls}")
    names = [_function(s)["name"] for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UnsupportedConstraint(f"function {dup[0]!r} is offered twice")
    if copy_from is not None and fmt != "python":
        raise UnsupportedConstraint(f"{source or 'tool_calls'}: strings: copy is implemented "
                                    f"for the python tool format only, not {fmt!r}")
    if fmt == "json" and not allow_text:
        c = Constraint.of_json_schema(calls_json_schema(specs, max_calls), source=source)
    elif fmt == "json":
        schema = json.dumps(calls_json_schema(specs, max_calls), ensure_ascii=False)
        c = Constraint.of_lark(f"start: calls | TEXT\ncalls: %json {schema}\n{_text_rule('{[')}",
                               source=source)
    elif fmt == "python":
        c = Constraint.of_lark(python_calls_lark(specs, max_calls, allow_text, copy_from),
                               source=source)
    elif fmt == "chat_template":
        c = Constraint.of_lark(chat_template_lark(specs, max_calls, allow_text), source=source)
    else:
        raise UnsupportedConstraint(f"tool-call format {fmt!r} has no grammar; known: json, "
                                    "python, chat_template")
    c.check()
    return c


def _text_rule(call_starts: str) -> str:
    # Plain text that does not open a call: its first character is none of `call_starts`
    # (nor whitespace, so a call cannot hide behind a leading space).
    excluded = "".join("\\" + ch for ch in call_starts)
    return f"TEXT: /[^{excluded}\\s][\\s\\S]*/\n"


def chat_template_lark(specs: Sequence[dict[str, Any]], max_calls: int,
                       allow_text: bool) -> str:
    one = calls_json_schema(specs, 1)
    lines = [
        "start: calls" + (" | TEXT" if allow_text else ""),
        "calls: call" + (f' ("\\n" call){{0,{max_calls - 1}}}' if max_calls > 1 else ""),
        'call: "<tool_call>\\n" body "\\n</tool_call>"',
        f"body: %json {json.dumps(one, ensure_ascii=False)}",
    ]
    return "\n".join(lines) + "\n" + (_text_rule("<") if allow_text else "")


# ------------------------------------------------------------------------- python (Lark)


class _Lark:
    """Collects the rules of one Lark grammar, naming each new rule uniquely. `string` is the
    expression a free string value is written with (STRING, or COPY under `copy_from`)."""

    def __init__(self, string: str = "STRING") -> None:
        self.rules: list[str] = []
        self.n = 0
        self.string = string

    def rule(self, body: str, hint: str = "r") -> str:
        self.n += 1
        name = f"{hint}{self.n}"
        self.rules.append(f"{name}: {body}")
        return name


def _lit(text: str) -> str:
    """A Lark string literal matching `text` exactly."""
    return json.dumps(text, ensure_ascii=False)


def py_literal(value: Any) -> str:
    """The Python source of a JSON value (what a BFCL call writes).

    >>> py_literal({"a": [True, None, 1.5, "x"]})
    '{"a": [True, None, 1.5, "x"]}'
    """
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(str(k))}: {py_literal(v)}"
                               for k, v in value.items()) + "}"
    raise UnsupportedConstraint(f"{value!r} has no Python literal")


_TERMINALS = """\
STRING: /"([^"\\\\\\n]|\\\\.)*"/
INT: /-?(0|[1-9][0-9]*)/
NUMBER: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/
any_value: STRING | NUMBER | "True" | "False" | "None" | any_list | any_dict
any_list: "[" (any_value (", " any_value)*)? "]"
any_dict: "{" (STRING ": " any_value (", " STRING ": " any_value)*)? "}"
"""


def _sequence(parts: list[tuple[str, bool]], sep: str, g: _Lark, hint: str) -> str:
    """A rule for `parts` (rule, required) in order, separated by `sep`, where optional parts
    may be left out: S_i = nothing emitted yet, T_i = something emitted (needs `sep`)."""
    s_next, t_next = '""', '""'
    for item, required in reversed(parts):
        s_i = f"{item} {t_next}"
        t_i = f"{_lit(sep)} {item} {t_next}"
        if not required:
            s_i, t_i = f"{s_i} | {s_next}", f"{t_i} | {t_next}"
        s_next, t_next = g.rule(s_i, hint + "s"), g.rule(t_i, hint + "t")
    return s_next


def _repeat(item: str, lo: int, hi: int | None, g: _Lark) -> str:
    """`[` lo..hi items `]` separated by ", "."""
    if hi is not None and hi < lo:
        raise UnsupportedConstraint(f"maxItems {hi} < minItems {lo}")
    if hi == 0:
        return '"[]"'
    tail_lo = max(lo - 1, 0)
    tail = "" if hi == 1 else f' (", " {item}){{{tail_lo},{"" if hi is None else hi - 1}}}'
    body = f'"[" {item}{tail} "]"'
    return body if lo >= 1 else f'{body} | "[]"'


def _value(schema: Any, g: _Lark, where: str) -> str:
    """A Lark expression for a Python literal valid under `schema`."""
    if schema is True or schema == {} or schema is None:
        return "any_value"
    if schema is False:
        raise UnsupportedConstraint(f"{where}: schema `false` admits no value")
    if not isinstance(schema, dict):
        raise UnsupportedConstraint(f"{where}: a schema must be a mapping")
    bad = [k for k in _UNSUPPORTED_PY if k in schema]
    if bad:
        raise UnsupportedConstraint(f"{where}: keyword {bad[0]!r} cannot be expressed in the "
                                    "python call grammar")
    if "const" in schema:
        return _lit(py_literal(schema["const"]))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise UnsupportedConstraint(f"{where}: enum must be a non-empty list")
        return g.rule(" | ".join(_lit(py_literal(v)) for v in values), "enum")
    for key in ("anyOf", "oneOf"):
        if key in schema:
            alts = [_value(s, g, f"{where}.{key}[{i}]") for i, s in enumerate(schema[key])]
            return g.rule(" | ".join(alts), "alt")
    t = schema.get("type")
    if isinstance(t, list):
        alts = [_value({**schema, "type": x}, g, where) for x in t]
        return g.rule(" | ".join(alts), "alt")
    if t is None:
        if "properties" in schema:
            t = "object"
        elif "items" in schema:
            t = "array"
        else:
            return "any_value"
    if t == "string":
        return g.string
    if t == "integer":
        return "INT"
    if t == "number":
        return "NUMBER"
    if t == "boolean":
        return '("True" | "False")'
    if t == "null":
        return '"None"'
    if t == "array":
        item = _value(schema.get("items", {}), g, f"{where}.items")
        return g.rule(_repeat(item, int(schema.get("minItems", 0)),
                              schema.get("maxItems"), g), "list")
    if t == "object":
        return _object(schema, g, where)
    raise UnsupportedConstraint(f"{where}: type {t!r} is not a JSON Schema type")


def _object(schema: dict[str, Any], g: _Lark, where: str) -> str:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        if schema.get("additionalProperties") is False:
            return '"{}"'
        return "any_dict"
    required = set(schema.get("required") or [])
    parts = [(g.rule(f"{_lit(py_literal(p) + ': ')} {_value(s, g, f'{where}.{p}')}", "kv"),
              p in required) for p, s in props.items()]
    return g.rule(f'"{{" {_sequence(parts, ", ", g, "obj")} "}}"', "dict")


def _call_rule(fn: dict[str, Any], g: _Lark) -> str:
    name = fn["name"]
    params = clean_schema(fn.get("parameters") or {}, closed=False)
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    bad = [k for k in _UNSUPPORTED_PY if k in params]
    if bad:
        raise UnsupportedConstraint(f"function {name}: keyword {bad[0]!r} cannot be expressed "
                                    "in the python call grammar")
    parts = []
    for p, s in props.items():
        if not p.isidentifier():
            raise UnsupportedConstraint(f"function {name}: parameter {p!r} is not a Python "
                                        "identifier, so it cannot be a keyword argument")
        value = _value(s, g, f"function {name}: parameter {p}")
        parts.append((g.rule(f"{_lit(p + '=')} {value}", "arg"), p in required))
    args = _sequence(parts, ", ", g, "args")
    return g.rule(f"{_lit(name + '(')} {args} \")\"", "call")


def python_calls_lark(specs: Sequence[dict[str, Any]], max_calls: int = 1,
                      allow_text: bool = False, copy_from: str | None = None) -> str:
    """The python (BFCL) call-list format as a Lark grammar (see the module docstring); with
    `copy_from`, every free string value is a span of that text (`copy_terminal`)."""
    copy = copy_terminal(copy_from) if copy_from is not None else None
    g = _Lark("COPY" if copy else "STRING")
    calls = [_call_rule(_function(s), g) for s in specs]
    call = g.rule(" | ".join(calls), "anycall")
    more = f' (", " {call}){{0,{max_calls - 1}}}' if max_calls > 1 else ""
    head = ["start: calls" + (" | TEXT" if allow_text else ""), f'calls: "[" {call}{more} "]"']
    text = _text_rule("[") if allow_text else ""
    return "\n".join(head + g.rules) + "\n" + _TERMINALS + (copy or "") + text


# A span may not cross what a Python string literal would have to escape.
_UNCOPYABLE = re.compile(r'["\\\x00-\x1f\x7f]+')


def copy_spans(text: str) -> list[str]:
    """The stretches of `text` a copied string may come from: split where a character would
    need escaping in a Python string literal (quotes, backslashes, newlines, controls), each
    stripped; duplicates once.

    >>> copy_spans('Find the movie "Heat" (1995)\\nby Michael Mann.')
    ['Find the movie', 'Heat', '(1995)', 'by Michael Mann.']
    """
    out: list[str] = []
    for part in _UNCOPYABLE.split(text):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def copy_terminal(text: str) -> str | None:
    """The COPY terminal: a double-quoted span of whole words of `text` (llguidance's
    `substring_words`: any run of consecutive word and punctuation chunks, e.g. "Paris" or
    "New York" from "hotels in New York near Paris", never "ew Yo"), with no space at either
    end and a letter or digit in it. None when `text` has nothing to copy (free strings stay STRING)."""
    spans = copy_spans(text)
    if not spans:
        return None
    alts = " | ".join(f"%regex {json.dumps({'substring_words': s}, ensure_ascii=False)}"
                      for s in spans)
    # intersected with "no space at either end" (a span may start at a space chunk) and "a
    # letter or digit somewhere" (a lone "," or "?" chunk is a span too)
    return f'COPY: "\\"" (({alts}) & /\\S(.*\\S)?/ & /.*[\\p{{L}}\\p{{N}}].*/) "\\""\n'

