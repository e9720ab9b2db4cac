"""Tool-call parsing: the three formats, tolerance of prose, refusal of code."""

from __future__ import annotations

import ast

import pytest

from coevo.envs.callparse import (
    format_tool_calls,
    parse_tool_calls,
    python_call_parts,
    safe_arithmetic,
)
from coevo.errors import CoevoError
from coevo.trajectory import ToolCall


def names_args(parsed):
    return [(c.name, c.arguments) for c in parsed.calls]


# ----------------------------------------------------------------------------------- json


def test_json_object_in_prose_and_fences():
    text = 'Sure, calling it now:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n```\nDone.'
    p = parse_tool_calls(text, "json")
    assert p.error is None
    assert names_args(p) == [("get_weather", {"city": "Paris", "days": 3})]


def test_json_list_and_openai_style_string_arguments():
    text = '[{"name": "f", "arguments": {"a": [1, 2]}}, {"function": {"name": "g", "arguments": "{\\"b\\": true}"}}]'
    assert names_args(parse_tool_calls(text, "json")) == [("f", {"a": [1, 2]}), ("g", {"b": True})]


def test_json_several_objects_and_parameters_alias():
    text = '{"name": "a", "parameters": {"x": 1}}\n{"name": "b"}'
    assert names_args(parse_tool_calls(text, "json")) == [("a", {"x": 1}), ("b", {})]


def test_json_malformed_is_an_error_not_a_raise():
    p = parse_tool_calls('{"name": "f", "arguments": {"a": 1}', "json")
    assert p.calls == [] and "invalid JSON" in p.error


def test_json_object_without_name_is_an_error():
    p = parse_tool_calls('{"city": "Paris"}', "json")
    assert p.calls == [] and "no 'name'" in p.error


def test_json_bad_arguments_type_is_an_error():
    p = parse_tool_calls('{"name": "f", "arguments": [1, 2]}', "json")
    assert p.calls == [] and "must be an object" in p.error


def test_plain_answer_is_no_call_and_no_error():
    for fmt in ("json", "python", "chat_template"):
        p = parse_tool_calls("The capital of France is Paris (I think).", fmt)
        assert p.calls == [] and p.error is None, fmt


# ---------------------------------------------------------------------------------- python


def test_python_bfcl_list_with_literals():
    p = parse_tool_calls('[f(a=1, b="x", c=[1, 2.5], d={"k": (1, 2)}, e=None, g=True), h(z=-3)]', "python")
    assert p.error is None
    assert names_args(p) == [
        ("f", {"a": 1, "b": "x", "c": [1, 2.5], "d": {"k": [1, 2]}, "e": None, "g": True}),
        ("h", {"z": -3}),
    ]


def test_python_dotted_name_bare_call_and_fences():
    p = parse_tool_calls("```python\nmath.factorial(number=5)\n```", "python")
    assert names_args(p) == [("math.factorial", {"number": 5})]


def test_python_call_inside_prose():
    p = parse_tool_calls("I will call [area(base=10, height=5)] to answer.", "python")
    assert names_args(p) == [("area", {"base": 10, "height": 5})]


def test_python_arithmetic_is_folded_safely():
    p = parse_tool_calls("[f(a=2**10, b=3*(4+1), c=-1.5)]", "python")
    assert names_args(p) == [("f", {"a": 1024, "b": 15, "c": -1.5})]


def test_python_code_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    text = f"[f(a=__import__('os').system('touch {marker}'), b=open('{marker}', 'w'))]"
    p = parse_tool_calls(text, "python")
    assert not marker.exists()
    # BFCL's convention: a nested call is kept as its source text, a plain string
    assert p.calls[0].arguments["a"].startswith("__import__('os').system(")
    assert isinstance(p.calls[0].arguments["b"], str)


def test_python_huge_power_refused():
    p = parse_tool_calls("[f(a=10**10**10)]", "python")
    assert p.calls == [] and "too large" in p.error


def test_python_positional_arguments_refused_but_available_low_level():
    p = parse_tool_calls("[sort('final_report.pdf')]", "python")
    assert p.calls == [] and "positional" in p.error
    assert python_call_parts("sort('a.pdf', reverse=True)") == [("sort", ["a.pdf"], {"reverse": True})]


def test_python_syntax_error_reported():
    p = parse_tool_calls("[f(a=1,, b=2)]", "python")
    assert p.calls == [] and p.error


# --------------------------------------------------------------------------- chat template


def test_chat_template_blocks_and_cut_closing_tag():
    text = (
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}"
    )
    p = parse_tool_calls(text, "chat_template")
    assert p.error is None and names_args(p) == [("f", {"a": 1}), ("g", {})]


def test_chat_template_bad_block_is_reported_good_ones_kept():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>'
    p = parse_tool_calls(text, "chat_template")
    assert names_args(p) == [("f", {})]
    assert "block 1" in p.error


# ------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("fmt", ["json", "python", "chat_template"])
def test_format_then_parse_round_trips(fmt):
    calls = [
        ToolCall(name="calc_area", arguments={"base": 10, "unit": "cm", "dims": [1, 2], "opt": {"k": "v"}}),
        ToolCall(name="other", arguments={"flag": False, "x": 0.5}),
    ]
    text = format_tool_calls(calls, fmt)
    p = parse_tool_calls(text, fmt)
    assert p.error is None
    assert names_args(p) == [(c.name, c.arguments) for c in calls]


def test_unknown_format_is_a_clear_error():
    with pytest.raises(CoevoError, match="known: json, python, chat_template"):
        parse_tool_calls("x", "yaml")


def test_overlong_text_not_parsed():
    p = parse_tool_calls("[" + "f(a=1)," * 5000 + "]", "python")
    assert p.calls == [] and "too long" in p.error


@pytest.mark.parametrize(
    "expr",
    ["x + 1", "a.b", "f(1)", "[1][0]", "'a' * 3", "lambda: 1", "True + 1", "2 ** 5000", "9 ** 9 ** 9"],
)
def test_safe_arithmetic_refuses(expr):
    with pytest.raises(ValueError):
        safe_arithmetic(ast.parse(expr, mode="eval").body)
