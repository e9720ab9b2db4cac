"""Parsing a model's tool-call text into `ToolCall`s, in three formats.

- "json": an object `{"name": ..., "arguments": {...}}` or a list of them (OpenAI-style
  `{"function": {"name", "arguments": "<json text>"}}` and `"parameters"` for `"arguments"`
  are accepted too), found anywhere in the text: prose and code fences around it are ignored.
- "python": BFCL's prompting format `[f(a=1), g(b="x")]` (a bare `f(a=1)` also works).
  Departure from BFCL's `default_decode_ast_prompting`: that decoder `eval`s arithmetic and
  lambdas found in arguments; here the text is parsed with `ast` and only literals are turned
  into values (numbers, strings, booleans, None, lists, tuples -> lists, dicts); arithmetic on
  numbers is folded by `safe_arithmetic`, never evaluated by Python. Like BFCL, a bare name
  (`f(x=y)`) becomes the string "y" and a nested call its source text: BFCL's checker treats
  those as "variables". Positional arguments are refused (BFCL ignores them silently), because
  the verifier keys arguments by name.
- "chat_template": `<tool_call>{json}</tool_call>` blocks as Qwen / SmolLM-style chat templates
  emit them; a final block whose closing tag was cut by a stop string still counts.

`parse_tool_calls` never raises on model output: it returns the calls it found and an error
message when the text tried to call a tool but could not be read. Text with no call in it at
all is no calls and no error (a plain answer).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from coevo.errors import CoevoError
from coevo.trajectory import ToolCall

CallFormat = Literal["json", "python", "chat_template"]
FORMATS: tuple[str, ...] = ("json", "python", "chat_template")

# Model output past this is not parsed: a runaway generation is not a tool call, and the
# candidate search below is quadratic in the worst case.
MAX_TEXT = 20_000


class ParsedCalls(BaseModel):
    model_config = ConfigDict(extra="forbid")
    calls: list[ToolCall] = Field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class ParseError(ValueError):
    """Internal: a candidate could not be read (the message becomes ParsedCalls.error)."""


def parse_tool_calls(text: str, fmt: str = "json") -> ParsedCalls:
    """Parse `text` in format `fmt` ("json", "python" or "chat_template").

    >>> parse_tool_calls('[f(a=1, b="x")]', "python").calls[0].arguments
    {'a': 1, 'b': 'x'}
    >>> parse_tool_calls("The answer is 4.", "json").calls
    []
    """
    if fmt not in FORMATS:
        raise CoevoError(f"tool-call format {fmt!r} is unknown; known: {', '.join(FORMATS)}")
    if text is None:
        return ParsedCalls()
    if len(text) > MAX_TEXT:
        return ParsedCalls(error=f"output too long to parse ({len(text)} > {MAX_TEXT} chars)")
    if fmt == "json":
        return parse_json_calls(text)
    if fmt == "python":
        return parse_python_calls(text)
    return parse_chat_template_calls(text)


# --------------------------------------------------------------------------------------- json

_DECODER = json.JSONDecoder()


def _call_from_obj(obj: Any) -> ToolCall:
    """One JSON object -> ToolCall, or ParseError saying which field is wrong."""
    if not isinstance(obj, dict):
        raise ParseError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI message style
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ParseError("tool call has no string 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI encodes arguments as JSON text
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ParseError(f"'arguments' of {name!r} is not valid JSON: {e.msg}") from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ParseError(f"'arguments' of {name!r} must be an object, got {type(args).__name__}")
    return ToolCall(name=name.strip(), arguments=args)


def _looks_like_call(obj: Any) -> bool:
    if isinstance(obj, dict):
        return "name" in obj or isinstance(obj.get("function"), dict)
    return isinstance(obj, list) and bool(obj) and all(_looks_like_call(o) for o in obj)


def _calls_from_value(obj: Any) -> list[ToolCall]:
    items = obj if isinstance(obj, list) else [obj]
    return [_call_from_obj(o) for o in items]


def parse_json_calls(text: str) -> ParsedCalls:
    """Every call-shaped JSON value in `text`, in order (several objects on separate lines
    are several calls)."""
    calls: list[ToolCall] = []
    first_error: str | None = None
    i, n = 0, len(text)
    while i < n:
        j = min((k for k in (text.find("{", i), text.find("[", i)) if k >= 0), default=-1)
        if j < 0:
            break
        try:
            value, end = _DECODER.raw_decode(text, j)
        except json.JSONDecodeError as e:
            first_error = first_error or f"invalid JSON at char {j}: {e.msg} (char {e.pos})"
            i = j + 1  # an inner brace may still start a valid value
            continue
        if _looks_like_call(value):
            try:
                calls.extend(_calls_from_value(value))
            except ParseError as e:
                first_error = first_error or str(e)
        elif isinstance(value, dict) and value:
            first_error = first_error or "JSON object is not a tool call (no 'name')"
        i = end
    if calls:
        return ParsedCalls(calls=calls)
    return ParsedCalls(error=first_error)


# ------------------------------------------------------------------------------ chat template

_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_chat_template_calls(text: str) -> ParsedCalls:
    """`<tool_call>{...}</tool_call>` blocks; a bad block is an error, good ones are kept."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for k, m in enumerate(_TAG.finditer(text)):
        body = _strip_fences(m.group(1))
        if not body:
            errors.append(f"tool_call block {k} is empty")
            continue
        try:
            value, end = _DECODER.raw_decode(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool_call block {k}: invalid JSON: {e.msg} (char {e.pos})")
            continue
        try:
            calls.extend(_calls_from_value(value))
        except ParseError as e:
            errors.append(f"tool_call block {k}: {e}")
    return ParsedCalls(calls=calls, error="; ".join(errors) or None)


def _strip_fences(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^```[A-Za-z0-9_-]*\s*", "", s)
    return re.sub(r"\s*```$", "", s).strip()


# ------------------------------------------------------------------------------------- python

_BIN_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_ABS = 1e100  # results past this are refused: no 10**10**10 memory bombs
MAX_EXPONENT = 1000
MAX_NODES = 200


def safe_arithmetic(node: ast.AST) -> int | float:
    """Evaluate a parsed arithmetic expression over numbers and + - * / // % ** ( ).

    Anything else (names, attributes, calls, subscripts, strings) raises ValueError, and so
    do huge results, so this is safe on untrusted text.

    >>> safe_arithmetic(ast.parse("2 * (3 + 4) ** 2", mode="eval").body)
    98
    """
    count = sum(1 for _ in ast.walk(node))
    if count > MAX_NODES:
        raise ValueError(f"expression too large ({count} nodes > {MAX_NODES})")
    return _arith(node)


def _arith(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _bounded(_UNARY_OPS[type(node.op)](_arith(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} too large (limit {MAX_EXPONENT})")
            if abs(left) > 1 and abs(right) * math.log10(abs(left)) > math.log10(MAX_ABS):
                raise ValueError("result too large")
        try:
            return _bounded(_BIN_OPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("result too large") from None
    raise ValueError(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")


def _bounded(x: Any) -> int | float:
    if isinstance(x, complex):
        raise ValueError("complex results are not allowed")
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError("result is not finite")
    if abs(x) > MAX_ABS:
        raise ValueError("result too large")
    return x


def literal_value(node: ast.AST) -> Any:
    """A call argument's value: literals, containers, folded arithmetic; BFCL's conventions
    for bare names (their text) and nested calls (their source)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [literal_value(e) for e in node.elts]  # tuples become lists, as JSON would
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ParseError("'**' unpacking is not allowed in a dict argument")
        return {literal_value(k): literal_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.UnaryOp, ast.BinOp)):
        try:
            return safe_arithmetic(node)
        except ValueError as e:
            raise ParseError(f"argument {ast.unparse(node)!r}: {e}") from None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        return ast.unparse(node)
    raise ParseError(f"argument {ast.unparse(node)!r} ({type(node).__name__}) is not a literal")


def _func_name(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ParseError(f"{ast.unparse(node)!r} is not a function name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def python_call_parts(text: str) -> list[tuple[str, list[Any], dict[str, Any]]]:
    """Parse exactly `[f(...), ...]` or `f(...)`: (name, positional values, keyword values)
    per call. Raises ParseError; callers that can map positionals (BFCL's multi-turn ground
    truth, via the method signature) use this directly."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ParseError(f"not a Python call list: {e.msg} (col {e.offset})") from None
    elts = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    out = []
    for elt in elts:
        if not isinstance(elt, ast.Call):
            raise ParseError(f"{ast.unparse(elt)!r} is not a function call")
        kwargs: dict[str, Any] = {}
        for kw in elt.keywords:
            if kw.arg is None:
                raise ParseError("'**' unpacking is not allowed in a call")
            kwargs[kw.arg] = literal_value(kw.value)
        if any(isinstance(a, ast.Starred) for a in elt.args):
            raise ParseError("'*' unpacking is not allowed in a call")
        out.append((_func_name(elt.func), [literal_value(a) for a in elt.args], kwargs))
    return out


# No space before "(": "the answer (4)" in prose is not a call attempt.
_CALL_START = re.compile(r"\[?\s*[A-Za-z_][\w.]*\(")


def parse_python_calls(text: str) -> ParsedCalls:
    """BFCL-style call lists; the whole text first (BFCL's own rule: strip fences, add the
    brackets), then the longest readable span starting at the first `name(`."""
    body = _strip_fences(text.strip().strip("`"))
    first = _CALL_START.search(body)
    if first is None:
        return ParsedCalls()  # no call attempted: a plain answer
    candidates = [body if body.startswith("[") else f"[{body}]"]
    start = first.start()
    closers = [m.start() + 1 for m in re.finditer(r"[\])]", body[start:])]
    for end in reversed(closers[-50:]):  # bounded: at most 50 spans tried
        candidates.append(body[start : start + end])
    error: str | None = None
    for cand in candidates:
        try:
            parts = python_call_parts(cand)
        except ParseError as e:
            error = error or str(e)
            continue
        except (RecursionError, MemoryError, ValueError):
            error = error or "call text too deeply nested"
            continue
        bad = [name for name, pos, _ in parts if pos]
        if bad:
            return ParsedCalls(
                error=f"positional arguments in {bad[0]}(...): name every argument (f(x=1))"
            )
        return ParsedCalls(calls=[ToolCall(name=n, arguments=kw) for n, _, kw in parts])
    return ParsedCalls(error=error or "could not read a call list")


# ------------------------------------------------------------------------------- formatting


def format_tool_calls(calls: list[ToolCall], fmt: str = "json") -> str:
    """The inverse of `parse_tool_calls` (for few-shot demos and tests)."""
    if fmt == "json":
        items = [{"name": c.name, "arguments": c.arguments} for c in calls]
        return json.dumps(items[0] if len(items) == 1 else items, ensure_ascii=False)
    if fmt == "python":
        return "[" + ", ".join(python_call_text(c.name, c.arguments) for c in calls) + "]"
    if fmt == "chat_template":
        return "\n".join(
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n</tool_call>"
            for c in calls
        )
    raise CoevoError(f"tool-call format {fmt!r} is unknown; known: {', '.join(FORMATS)}")


def python_call_text(name: str, arguments: dict[str, Any]) -> str:
    """`name(k=repr(v), ...)`: JSON values have Python literal reprs, so this round-trips."""
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"
