"""The verifier's diagnosis of failed episodes (Score.feedback) and the digest's "Failure kinds"
(coevo/envs/*, coevo/propose/feedback.py, coevo/propose/digest.py)."""

from __future__ import annotations

import json

import pytest

from coevo.assets.harness import Harness
from coevo.envs import Response, make_env
from coevo.envs.base import Feedback
from coevo.envs.bfcl import BFCLEnv
from coevo.envs.callparse import format_tool_calls
from coevo.envs.jsonl import JsonlEnv
from coevo.propose.base import Incumbent, ProposalContext
from coevo.propose.digest import digest
from coevo.propose.feedback import verifier_feedback
from coevo.propose.harness import HarnessProposer
from coevo.trajectory import ToolCall, Trajectory, Turn


@pytest.fixture(scope="module")
def bfcl():
    return BFCLEnv("simple_python")


def bfcl_score(env, calls):
    task = {t.id: t for t in env.all_tasks()}["simple_python_0"]  # calculate_triangle_area(10, 5)
    return env.score(task, None, Response(tool_calls=calls, text=format_tool_calls(calls, "python")))


def test_bfcl_failures_carry_the_real_checkers_diagnosis(bfcl):
    wrong_type = bfcl_score(bfcl, [ToolCall(name="calculate_triangle_area",
                                            arguments={"base": "10", "height": 5})])
    assert not wrong_type.success and wrong_type.info["error_type"] == "type_error:simple"
    assert wrong_type.feedback.kind == "wrong_type"
    assert wrong_type.feedback.text == ("Incorrect type for parameter 'base'. Expected type "
                                        "integer, got str. Parameter value: '10'.")
    missing = bfcl_score(bfcl, [ToolCall(name="calculate_triangle_area", arguments={"base": 10})])
    assert (missing.feedback.kind, missing.feedback.text) == (
        "missing_parameter", "Missing required parameter: 'height'.")
    name = bfcl_score(bfcl, [ToolCall(name="triangle_area", arguments={"base": 10, "height": 5})])
    assert name.feedback.kind == "wrong_function"
    value = bfcl_score(bfcl, [ToolCall(name="calculate_triangle_area",
                                       arguments={"base": 10, "height": 7})])
    assert value.feedback.kind == "wrong_value" and "Expected one of [5]" in value.feedback.text
    right = bfcl_score(bfcl, [ToolCall(name="calculate_triangle_area",
                                       arguments={"base": 10, "height": 5})])
    assert right.success and right.feedback is None


def test_arithmetic_wrong_answer_says_expected_and_given():
    env = make_env("rg:basic_arithmetic?min_terms=2&max_terms=2", size=20)
    task = env.tasks("train")[0]
    expected = task.answer["answer"]
    wrong = str(int(expected) + 7)
    s = env.score(task, None, Response(text=wrong))
    assert not s.success
    assert (s.feedback.kind, s.feedback.text) == ("wrong_answer", f"expected {expected!r}, given {wrong!r}")
    empty = env.score(task, None, Response(text=""))
    assert empty.feedback.kind == "no_answer" and repr(expected) in empty.feedback.text
    assert env.score(task, None, Response(text=expected)).feedback is None


def test_task_file_checks_explain_their_failures(tmp_path):
    path = tmp_path / "tasks.jsonl"
    lines = [{"id": "pi", "prompt": "pi?", "answer": 3.14, "verifier": {"name": "numeric", "tolerance": 0.01}},
             {"id": "cap", "prompt": "capital?", "answer": "Paris"},
             {"id": "call", "prompt": "book", "verifier": "tool_calls",
              "answer": {"name": "book", "arguments": {"to": "FCO"}}}]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    env = JsonlEnv(str(path))
    tasks = {t.id: t for t in env.all_tasks()}
    fb = env.score(tasks["pi"], None, Response(text="about 3.2")).feedback
    assert (fb.kind, fb.text) == ("wrong_answer", "expected 3.14 (tolerance 0.01), given 3.2 (from 'about 3.2')")
    assert env.score(tasks["pi"], None, Response(text="no idea")).feedback.kind == "no_number"
    fb = env.score(tasks["cap"], None, Response(text="Lyon")).feedback
    assert (fb.kind, fb.text) == ("wrong_answer", "expected 'Paris', given 'Lyon'")
    fb = env.score(tasks["call"], None, Response(tool_calls=[ToolCall(name="book", arguments={"to": "OSL"})])).feedback
    assert fb.kind == "wrong_arguments" and 'book({"to": "FCO"})' in fb.text and "OSL" in fb.text
    assert env.score(tasks["call"], None, Response()).feedback.kind == "no_call"


def traj(i: int, kind: str | None, split: str = "train", success: bool = False) -> Trajectory:
    return Trajectory(id=f"t{i}", env="e", task_id=f"task-{i}", split=split,
                      messages=[{"role": "user", "content": f"q{i}"},
                                {"role": "assistant", "content": f"a{i}"}],
                      outcome=float(success), success=success, reward=float(success))


def test_digest_groups_failures_by_kind_with_counts_and_drops_val_feedback():
    kinds = ["wrong_type"] * 5 + ["missing_parameter"] * 3 + ["wrong_function"] + [None] * 2
    trajs = [traj(i, k) for i, k in enumerate(kinds)] + [traj(50, None, success=True)]
    feedback = {f"t{i}": Feedback.of(k, f"{k} line {i % 2}") for i, k in enumerate(kinds) if k}
    # a val-split failure with feedback naming its expected answer: never shown
    trajs.append(traj(99, "wrong_value", split="val"))
    feedback["t99"] = Feedback.of("wrong_value", "expected SECRET-VAL-ANSWER")
    d = digest(trajs, n_fail=20, feedback=feedback)
    assert [(k.kind, k.count) for k in d.failure_kinds] == [
        ("wrong_type", 5), ("missing_parameter", 3), ("wrong_function", 1)]
    assert d.undiagnosed == 2
    assert d.failure_kinds[0].examples == ["wrong_type line 0", "wrong_type line 1"]
    text = d.text(6000)
    assert "Failure kinds (the verifier's own diagnosis of 11 failed train episodes):" in text
    assert "- wrong_type: 5\n    e.g. wrong_type line 0\n    e.g. wrong_type line 1" in text
    assert "- (no diagnosis): 2" in text
    assert "verifier: wrong_type: wrong_type line" in text  # a failed transcript's own line
    assert "SECRET-VAL-ANSWER" not in text and "wrong_value" not in text
    assert not any(s.feedback for s in d.failures if s.id == "t99")
    # the section stays within a quarter of the budget: examples go first, then lines
    short = d.kinds_text(160)
    assert len(short) <= 160 and "- wrong_type: 5\n- missing_parameter: 3\n" in short
    assert "e.g." not in short and short.endswith("(2 more kind(s) left out for length)")


def test_verifier_feedback_rescores_train_failures_only():
    env = make_env("rg:basic_arithmetic?min_terms=2&max_terms=2", size=30)
    train, val = env.tasks("train")[0], env.tasks("val")[0]

    def episode(task, split, answer):
        ok = answer == task.answer["answer"]
        return Trajectory(id=f"{split}-{task.id}", env=env.name, task_id=task.id, split=split,
                          answer=answer, outcome=float(ok), success=ok,
                          turns=[Turn(index=0, start=0, end=0, text=f"Answer: {answer}")])

    bad_train = episode(train, "train", "12345")
    bad_val = episode(val, "val", "12345")
    good = episode(train, "train", train.answer["answer"]).model_copy(update={"id": "good"})
    out = verifier_feedback(env, [bad_train, bad_val, good])
    assert set(out) == {bad_train.id}
    assert out[bad_train.id].text == f"expected {train.answer['answer']!r}, given '12345'"
    # a train-labelled trajectory of a task the train split does not hold gets none either
    forged = bad_val.model_copy(update={"id": "forged", "split": "train"})
    assert verifier_feedback(env, [forged]) == {}


def test_the_harness_proposers_prompt_carries_the_failure_kinds():
    h = Harness(name="h", system_prompt="Solve it.")
    trajs = [traj(i, "wrong_answer").model_copy(update={"harness": h.hash}) for i in range(3)]
    fb = {t.id: Feedback.of("wrong_answer", f"expected '{i}', given 'x'") for i, t in enumerate(trajs)}
    ctx = ProposalContext(run="r", round=0, incumbent=Incumbent(harness=h), trajectories=trajs,
                          harnesses={h.hash: h}, feedback=fb)
    inputs = HarnessProposer(backend=object()).inputs(ctx)
    assert "- wrong_answer: 3\n    e.g. expected '0', given 'x'" in inputs["round_digest"]
