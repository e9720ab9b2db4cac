"""BFCL's own decoder for its Python prompting format, reproduced without `eval`.

BFCL scores a prompting model's text with `default_decode_ast_prompting` (bfcl_eval
model_handler/utils.py): strip backticks, newlines and spaces from both ends, wrap the text in
`[...]` when it does not start / end with a bracket, `ast.parse` it, and read every element as a
call (`resolve_ast_call`, `resolve_ast_by_type`). Whatever that decoder cannot read is a decode
failure, so "BFCL accuracy" must use exactly these rules: prose before or after the call list
fails (`Sure! [f(a=1)]`, `[f(a=1)] thanks`), while positional arguments are dropped silently
(`[f(True)]` decodes to `{"f": {}}`). coevo's harness parser (coevo/envs/callparse.py) is more
lenient on purpose and refuses positional arguments; `BFCLEnv` scores its outcome with this
decoder and reports the lenient one as its own detail.

Value rules, as BFCL's (what they return, including their quirks):
- constants as they are (`...` -> "..."), lists, dicts, tuples (kept as tuples: BFCL's checker
  then refuses them where it wants a list), bare names -> their text, a nested call without
  keywords -> its source text, with keywords -> {name: {arg: value}}, a subscript -> its source;
- a unary operator on a constant -> minus the constant (BFCL reads `-x`, `+x` and `not x` all
  as -x);
- arithmetic (`BinOp`) -> its value. BFCL `eval`s the expression; here it is folded by
  `callparse.safe_arithmetic` over numbers only (never evaluated by Python), so arithmetic on
  strings or lists, which BFCL would evaluate, is a decode failure here: the one departure,
  kept because model text is never run.
- anything else (sets, attributes like `math.pi`, comparisons, lambdas: BFCL's own lambda
  branch raises) is a decode failure.

>>> bfcl_decode('[f(a=1)]')
[{'f': {'a': 1}}]
>>> bfcl_decode('[f(True)]')
[{'f': {}}]
>>> bfcl_decode('Sure! [f(a=1)]') is None, bfcl_decode('[f(a=1)] thanks') is None
(True, True)
"""

from __future__ import annotations

import ast
from typing import Any

from coevo.envs.callparse import MAX_TEXT, safe_arithmetic


class _Undecodable(Exception):
    """Where BFCL's decoder would raise."""


def bfcl_decode(text: str) -> list[dict[str, dict[Any, Any]]] | None:
    """BFCL's decoded form `[{name: {arg: value}}]` of `text`, or None where BFCL's decoder
    fails (module docstring)."""
    if text is None or len(text) > MAX_TEXT:
        return None
    result = text.strip("`\n ")
    if not result.startswith("["):
        result = "[" + result
    if not result.endswith("]"):
        result = result + "]"
    try:
        body = ast.parse(result.strip().strip("'"), mode="eval").body
        elts = [body] if isinstance(body, ast.Call) else getattr(body, "elts", None)
        if elts is None:
            return None
        return [_call(e) for e in elts]
    except (SyntaxError, ValueError, RecursionError, MemoryError, _Undecodable):
        return None


def _call(node: ast.AST) -> dict[str, dict[Any, Any]]:
    if not isinstance(node, ast.Call):  # BFCL asserts every element is a call
        raise _Undecodable
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return {".".join(reversed(parts)): {kw.arg: _value(kw.value) for kw in node.keywords}}


def _value(node: ast.AST | None) -> Any:
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.operand, ast.Constant):
            raise _Undecodable
        try:
            return -node.operand.value
        except TypeError:
            raise _Undecodable from None
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp):
        try:
            return safe_arithmetic(node)
        except ValueError:
            raise _Undecodable from None
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _call(node) if node.keywords else ast.unparse(node)
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise _Undecodable
