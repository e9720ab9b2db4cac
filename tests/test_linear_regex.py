"""Proposal-editable regexes run on RE2 (coevo/linear_regex.py): a catastrophic pattern on a
long text finishes with the right answer, and what RE2 cannot do is refused at validation with
the field named."""

from __future__ import annotations

import pytest

from coevo.assets.harness import AnswerExtraction
from coevo.assets.io import parse_asset
from coevo.assets.rubric import Rubric
from coevo.envs.base import Response, Score, Task
from coevo.errors import AssetError
from coevo.linear_regex import compile_pattern, to_re2
from coevo.rewards import regex_reward, score_rubric

EVIL = r"^(a|a)*$"  # `re` needs 1.7 s on 24 characters, doubling per character


def test_a_catastrophic_pattern_on_5000_chars_completes_with_the_right_answer():
    near = "a" * 5000 + "b"  # the worst case for a backtracking engine: no match
    assert regex_reward(near, EVIL) == 0.0 and regex_reward(near, EVIL, must_match=False) == 1.0
    assert regex_reward("a" * 5000, EVIL) == 1.0
    extract = AnswerExtraction(method="regex", pattern=r"^((a|a)*)$")
    assert extract.extract(near) is None and extract.extract("a" * 5000) == "a" * 5000
    rubric = Rubric.model_validate({"name": "r", "criteria": [
        {"id": "evil", "kind": "regex", "params": {"pattern": EVIL, "target": "text"}},
        {"id": "nested", "kind": "regex", "params": {"pattern": r"(a+)+$", "ignore_case": True}}]})
    got = score_rubric(rubric, Task(id="t", env="e", messages=[]), Response(text=near.upper()),
                       Score(outcome=0.0, success=False))
    assert got == {"evil": 0.0, "nested": 0.0}


@pytest.mark.parametrize("text, field, expected", [
    ("name: r\ncriteria: [{id: a, kind: regex, params: {pattern: '(a)\\1'}}]\n",
     "criteria.0.params.pattern", "does not compile: RE2 cannot compile it: invalid escape sequence: \\1"),
    ("name: r\ncriteria: [{id: a, kind: regex, params: {pattern: 'x(?=y)'}}]\n",
     "criteria.0.params.pattern", "does not compile: RE2 cannot compile it: invalid perl operator: (?="),
])
def test_patterns_re2_rejects_are_a_clear_error_naming_the_field(text, field, expected):
    with pytest.raises(AssetError) as e:
        parse_asset(text, "rubrics/r.yaml")
    assert str(e.value).startswith(f"rubrics/r.yaml: {field}: {expected}")
    assert "\n" not in str(e.value)


def test_harness_answer_extraction_pattern_re2_rejects(capfd):
    text = ("name: h\nsystem_prompt: s\nworkflow: {answer_extraction: {method: regex, "
            "pattern: '(?<=Answer: )\\d+'}}\n")
    with pytest.raises(AssetError) as e:
        parse_asset(text, "harnesses/h.yaml")
    assert str(e.value).startswith("harnesses/h.yaml: workflow.answer_extraction: pattern does "
                                   "not compile: RE2 cannot compile it: invalid perl operator: (?<")
    assert capfd.readouterr().err == ""  # RE2 logs rejected patterns to stderr unless told not to


def test_python_spellings_with_an_re2_equivalent_are_translated():
    assert to_re2(r"end\Z") == r"end\z" and to_re2(r"lit\\Z") == r"lit\\Z"
    assert compile_pattern(r"(?im)^answer:\s*\S+\s*\Z").search("x\nAnswer: 4") is not None
    assert compile_pattern(r"(?P<n>\d+)").search("ab 12").group("n") == "12"
    assert compile_pattern("abc", ignore_case=True).search("xABCx") is not None
