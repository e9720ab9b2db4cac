"""Rubric criteria -> rewards (coevo/rewards.py)."""

from __future__ import annotations

import asyncio

import pytest

from coevo.assets.rubric import Rubric
from coevo.checks import CHECKS
from coevo.envs.base import Response, Score, Task
from coevo.errors import CoevoError
from coevo.models.scripted import ScriptedBackend
from coevo.rewards import ascore_rubric, reward, score_rubric, tool_called_reward
from coevo.trajectory import ToolCall

AREA = {"type": "function", "function": {
    "name": "geometry.area", "description": "Triangle area.",
    "parameters": {"type": "object", "required": ["base", "height"],
                   "properties": {"base": {"type": "number"}, "height": {"type": "number"}}}}}
TASK = Task(id="t1", env="test", messages=[{"role": "user", "content": "Area of base 3, height 4?"}],
            tools=[AREA])


def rubric(*criteria, outcome_weight=1.0):
    return Rubric.model_validate({"name": "r", "outcome_weight": outcome_weight,
                                  "criteria": list(criteria)})


def nonneg_answer(task, response, score, trajectory=None, minimum=0):
    """A python criterion: pays when the answer is a number >= minimum."""
    try:
        return float(response.text) >= minimum
    except ValueError:
        return 0.0


def broken_check(task, response, score):
    raise ZeroDivisionError("bug in the check")


# Python criteria may name registered checks only (coevo.checks); these two are the tests'.
for _fn in (nonneg_answer, broken_check):
    if f"tests.test_rewards:{_fn.__name__}" not in CHECKS:
        CHECKS.add(f"tests.test_rewards:{_fn.__name__}", _fn)


def test_every_programmatic_kind_scores_real_values():
    r = rubric(
        {"id": "verified", "kind": "outcome"},
        {"id": "decodes", "kind": "outcome", "params": {"detail": "decodes"}},
        {"id": "number", "kind": "regex", "params": {"pattern": r"^\d+(\.\d+)?$"}},
        {"id": "no-refusal", "kind": "regex",
         "params": {"pattern": "cannot", "must_match": False, "ignore_case": True}},
        {"id": "json", "kind": "json_schema",
         "params": {"json_schema": {"type": "number", "minimum": 0}}},
        {"id": "offered", "kind": "tool_called", "params": {"name_in_offered": True}},
        {"id": "required", "kind": "tool_called", "params": {"required_args": True}},
        {"id": "values", "kind": "tool_called", "params": {"args_match": True}},
        {"id": "py", "kind": "python",
         "params": {"callable": "tests.test_rewards:nonneg_answer", "kwargs": {"minimum": 5}}},
    )
    good = Response(text="6", tool_calls=[ToolCall(name="geometry.area",
                                                   arguments={"base": 3, "height": 4})])
    score = Score(outcome=1.0, success=True, details={"decodes": 1.0, "args_correct": 0.5})
    c = score_rubric(r, TASK, good, score)
    assert c == {"verified": 1.0, "decodes": 1.0, "number": 1.0, "no-refusal": 1.0, "json": 1.0,
                 "offered": 1.0, "required": 1.0, "values": 0.5, "py": 1.0}

    # the FACTS.md hack: copying the demo's call of another function decodes, but earns no
    # name credit; missing required args and a refusal are caught too
    copied = Response(text="I cannot", tool_calls=[ToolCall(name="demo_fn", arguments={"x": 1})])
    c = score_rubric(r, TASK, copied, Score(outcome=0.0, success=False, details={"decodes": 1.0}))
    assert c["decodes"] == 1.0 and c["offered"] == 0.0 and c["required"] == 0.0
    assert c["number"] == 0.0 and c["no-refusal"] == 0.0 and c["json"] == 0.0 and c["py"] == 0.0
    assert "values" not in c  # the environment reported no argument detail: missing, not 0


def test_tool_called_constraints_multiply_and_no_call_is_zero():
    half = [ToolCall(name="geometry_area", arguments={"base": 1, "height": 2}),
            ToolCall(name="geometry_area", arguments={"base": 1})]
    assert tool_called_reward(half, [AREA], required_args=True) == 0.5
    assert tool_called_reward(half, [AREA], name_in_offered=True, name="other") == 0.0
    assert tool_called_reward([], [AREA]) == 0.0


def test_python_criterion_errors(caplog, capsys, monkeypatch):
    r = rubric({"id": "py", "kind": "python",
                "params": {"callable": "tests.test_rewards:broken_check"}})
    score = Score(outcome=1.0, success=True)
    assert score_rubric(r, TASK, Response(text="1"), score) == {}  # a buggy check is missing
    # an unregistered reference (a stored rubric from before registration, a typo) is
    # missing data, logged, and runs nothing: it used to import and call any callable
    r = rubric({"id": "py", "kind": "python", "params": {"callable": "builtins:print",
                                                         "kwargs": {"sep": "PWNED"}}},
               {"id": "gone", "kind": "python", "params": {"callable": "no_such_pkg.mod:f"}})
    monkeypatch.setattr("coevo.rewards._WARNED", set())
    with caplog.at_level("WARNING", logger="coevo.rewards"):
        assert score_rubric(r, TASK, Response(text="1"), score) == {}
        assert score_rubric(r, TASK, Response(text="2"), score) == {}
    assert "PWNED" not in capsys.readouterr().out
    warned = [m for m in caplog.messages if "is not registered" in m]
    assert len(warned) == 2 and "'builtins:print'" in warned[0]  # once per reference


def test_llm_judge_parses_score_and_failure_is_missing():
    r = rubric({"id": "judge", "kind": "llm_judge",
                "params": {"question": "Is the answer correct?", "scale": 5}})
    score = Score(outcome=0.0, success=False)
    judge = ScriptedBackend(["4 - mostly right", "no idea", "9"])
    got = [score_rubric(r, TASK, Response(text="6"), score, judge=judge) for _ in range(3)]
    assert got == [{"judge": 0.8}, {}, {}]  # unparseable and out-of-scale answers: missing
    asked = judge.requests[0].messages[-1]["content"]
    assert "Area of base 3" in asked and "Is the answer correct?" in asked and "6" in asked
    # the judge's own failure (an error completion) is missing too, also through the async path
    exhausted = ScriptedBackend([])
    assert asyncio.run(ascore_rubric(r, TASK, Response(text="6"), score, judge=exhausted)) == {}
    with pytest.raises(CoevoError, match="no judge backend"):
        score_rubric(r, TASK, Response(text="6"), score)


def test_reward_combines_outcome_and_weighted_criteria():
    r = rubric({"id": "a", "kind": "tool_called", "weight": 1.0},
               {"id": "b", "kind": "tool_called", "weight": 3.0}, outcome_weight=2.0)
    assert reward(r, 1.0, {"a": 1.0, "b": 0.0}) == pytest.approx(2.0 + 0.25)
    assert reward(r, 0.0, {"a": 1.0, "b": 1.0}) == pytest.approx(1.0)
    assert reward(r, 0.0, {"a": 1.0}) == pytest.approx(1.0)  # b missing: out of both sums
    assert reward(r, 0.5, {}) == pytest.approx(1.0)
    assert reward(r, None, {"a": 1.0}) is None  # no verified outcome: no reward
    assert reward(None, 0.5, {}) == 0.5


# -- predicates rubrics (prerequisites) -------------------------------------------------------
def predicates():
    # calls (w 1) <- named (w 2) <- args (w 1); polite (w 1) has no prerequisite
    return rubric({"id": "calls", "kind": "tool_called", "weight": 1.0},
                  {"id": "named", "kind": "tool_called", "weight": 2.0, "requires": ["calls"],
                   "params": {"name_in_offered": True}},
                  {"id": "args", "kind": "tool_called", "weight": 1.0, "requires": ["named"],
                   "params": {"required_args": True}},
                  {"id": "polite", "kind": "regex", "weight": 1.0,
                   "params": {"pattern": "please"}}, outcome_weight=1.0)


def test_prerequisites_gate_partial_credit_in_dependency_order():
    r = predicates()
    # All pass: (1 + 2 + 1 + 1) / 5 = 1.
    assert reward(r, 0.0, {"calls": 1.0, "named": 1.0, "args": 1.0, "polite": 1.0}) == 1.0
    # named fails: args pays 0 although its own check passed -> (1 + 0 + 0 + 1) / 5 = 0.4
    # (without prerequisites it would be (1 + 0 + 1 + 1) / 5 = 0.6).
    assert reward(r, 0.0, {"calls": 1.0, "named": 0.0, "args": 1.0, "polite": 1.0}) == \
        pytest.approx(0.4)
    # calls passes at 0.5 (the pass mark), named 0.4 < 0.5 pays 0.4 but blocks args:
    # (0.5 + 0.8 + 0 + 0) / 5 = 0.26, outcome 1 -> 1.26
    assert reward(r, 1.0, {"calls": 0.5, "named": 0.4, "args": 1.0, "polite": 0.0}) == \
        pytest.approx(1.26)
    # calls missing: named and args are missing too -> only polite counts: 1 / 1
    assert reward(r, 0.0, {"named": 1.0, "args": 1.0, "polite": 1.0}) == pytest.approx(1.0)


def test_prerequisite_cycles_and_unknown_ids_are_schema_errors():
    with pytest.raises(ValueError, match=r"prerequisite cycle: named -> args -> named"):
        rubric({"id": "named", "kind": "tool_called", "requires": ["args"]},
               {"id": "args", "kind": "tool_called", "requires": ["named"]})
    with pytest.raises(ValueError, match=r"prerequisite cycle: a -> a"):
        rubric({"id": "a", "kind": "tool_called", "requires": ["a"]})
    with pytest.raises(ValueError, match=r"criterion 'a' requires 'b', which is not a criterion"):
        rubric({"id": "a", "kind": "tool_called", "requires": ["b"]})


def test_a_rubric_without_prerequisites_hashes_as_before():
    r = rubric({"id": "a", "kind": "tool_called"})
    assert "requires" not in r.content()["criteria"][0]
    assert predicates().content()["criteria"][1]["requires"] == ["calls"]
    assert Rubric.model_validate(predicates().content()) == predicates()  # round-trips
