"""The rubric predictive-validity gate (coevo/validity.py).

Synthetic cases use real BFCL tasks with regex criteria on marked answers and chosen stored
outcomes (the label is the stored outcome, so the better rubric is known by construction).
The real case rebuilds FACTS.md's reward hack: outputs that copy the worked example's call
verbatim decode but name a function the task does not offer.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from coevo.assets.io import load_asset
from coevo.assets.rubric import Rubric
from coevo.envs.bfcl import reference_calls
from coevo.envs.callparse import format_tool_calls, parse_tool_calls
from coevo.envs.registry import make_env
from coevo.envs.base import Response
from coevo.store.records import EvidenceRow
from coevo.trajectory import Trajectory, ToolResult, Turn
from coevo.validity import (
    ValidityPolicy,
    auc,
    partial_rubric,
    rescore,
    response_of,
    validity_decision,
)

from conftest import REPO

WORKED_EXAMPLE = '[get_stock_price(symbol="AAPL", exchange="NASDAQ")]'  # harnesses/function_calling.yaml


@pytest.fixture(scope="module")
def env():
    return make_env("bfcl:simple_python")


@pytest.fixture(scope="module")
def val(env):
    return env.tasks("val")


def traj(task, text: str, outcome: float | None, *, sample: int = 0, status: str = "ok",
         split: str = "val", id: str | None = None) -> Trajectory:
    """A stored single-turn episode: the task's messages, the policy's text, its parsed calls
    (as coevo.agent.graph parses them under the python tool format)."""
    calls = parse_tool_calls(text, "python").calls
    turn = Turn(index=0, start=0, end=0, text=text, tool_calls=calls)
    messages = [*task.messages, {"role": "assistant", "content": text}]
    return Trajectory(id=id or f"{task.id}:{sample}:{hashlib.sha1(text.encode()).hexdigest()[:8]}", env=task.env,
                      task_id=task.id, split=split, sample_index=sample, answer=text,
                      messages=messages, outcome=outcome,
                      success=bool(outcome and outcome >= 0.5), turns=[turn],
                      status=status)  # type: ignore[arg-type]


def marker_rubric(name: str, marker: str, *, with_outcome: bool = True) -> Rubric:
    crit = [{"id": "marker", "kind": "regex", "weight": 1.0, "params": {"pattern": marker}}]
    if with_outcome:  # label-leaking: must be ignored by the partial score
        crit.insert(0, {"id": "outcome", "kind": "outcome", "weight": 5.0})
    return Rubric.model_validate({"name": name, "criteria": crit})


def synthetic(val, n: int = 40, seed: int = 1) -> list[Trajectory]:
    """Half pass. 'GOOD' appears in 18/20 passed and 2/20 failed answers (predicts the
    outcome); 'COIN' is a fair coin independent of it."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        passed = i % 2 == 0
        good = (i % 20 != 0) if passed else (i % 20 == 1)
        words = ["GOOD" if good else "bad", "COIN" if rng.random() < 0.5 else "tail"]
        out.append(traj(val[i % len(val)], " ".join(words), 1.0 if passed else 0.0, sample=i))
    return out


# --------------------------------------------------------------------------- unit pieces


def test_auc_ties_and_perfect():
    assert auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert auc([0.5, 0.5, 0.5, 0.5], [True, False, True, False]) == 0.5
    # one tie between a pass and a fail counts half: pairs (1,0)=1, (1,.5)=1, (.5,0)=1, (.5,.5)=.5
    assert auc([1.0, 0.5, 0.5, 0.0], [True, True, False, False]) == pytest.approx(3.5 / 4)


def test_partial_score_excludes_outcome_and_weights(env, val):
    r = Rubric.model_validate({"name": "r", "criteria": [
        {"id": "outcome", "kind": "outcome", "weight": 9.0},
        {"id": "a", "kind": "regex", "weight": 3.0, "params": {"pattern": "A"}},
        {"id": "b", "kind": "regex", "weight": 1.0, "params": {"pattern": "B"}},
        {"id": "detail", "kind": "outcome", "weight": 0.0, "params": {"detail": "nope"}}]})
    assert [c.id for c in partial_rubric(r).criteria] == ["a", "b", "detail"]
    t = [traj(val[0], "A only", 1.0), traj(val[1], "B only", 0.0), traj(val[2], "A and B", 1.0)]
    # 'detail' is missing (BFCL reports no such detail): drops out, never a zero
    assert rescore(r, t, env) == [pytest.approx(0.75), pytest.approx(0.25), pytest.approx(1.0)]
    only_outcome = Rubric.model_validate({"name": "o", "criteria": [
        {"id": "outcome", "kind": "outcome", "weight": 1.0}]})
    assert partial_rubric(only_outcome) is None
    assert rescore(only_outcome, t, env) == [None, None, None]


def test_rescore_missing_for_infra_and_unverified(env, val):
    r = marker_rubric("r", "x")
    t = [traj(val[0], "x", 1.0), traj(val[1], "x", None), traj(val[2], "x", 0.0, status="infra_error")]
    assert rescore(r, t, env) == [1.0, None, None]


def test_llm_judge_without_judge_is_missing(env, val):
    r = Rubric.model_validate({"name": "j", "criteria": [
        {"id": "judge", "kind": "llm_judge", "params": {"question": "Is it right?"}},
        {"id": "m", "kind": "regex", "params": {"pattern": "x"}}]})
    assert rescore(r, [traj(val[0], "x", 1.0), traj(val[0], "y", 0.0)], env) == [1.0, 0.0]


def test_response_rebuilt_like_finish_node(val):
    text = '[calc(a=1)]'
    t = traj(val[0], text, 0.0)
    t.turns.insert(0, Turn(index=0, start=0, end=0, text="[first(x=2)]",
                           tool_calls=parse_tool_calls("[first(x=2)]", "python").calls,
                           tool_results=[ToolResult(name="first", content="ok")]))
    r = response_of(t)
    assert isinstance(r, Response) and r.text == text
    assert [c.name for c in r.tool_calls] == ["calc"]
    assert [[c.name for c in turn] for turn in r.all_tool_calls] == [["first"], ["calc"]]


def test_unknown_task_is_a_clear_error(env, val):
    t = traj(val[0], "x", 1.0).model_copy(update={"task_id": "no_such_task"})
    with pytest.raises(Exception, match="no_such_task.*'val' split"):
        rescore(marker_rubric("r", "x"), [t], env)


# --------------------------------------------------------------------------- decisions


def test_correlated_beats_uncorrelated_and_not_reverse(env, val):
    trajs = synthetic(val)
    good, coin = marker_rubric("good", "GOOD"), marker_rubric("coin", "COIN")
    d, rows = validity_decision(coin, good, trajs, env)
    assert d.accepted and d.policy == "validity" and d.rollouts == 0
    assert d.statistic["auc_candidate"] == pytest.approx(0.9)  # 18/20 vs 2/20: (0.9+0.9)/2
    assert d.statistic["auc_incumbent"] < 0.7
    assert d.statistic["ci_low"] > 0
    assert d.statistic["candidate_failed_mean"] == pytest.approx(0.1)
    assert d.statistic["candidate_passed_mean"] == pytest.approx(0.9)
    assert d.statistic["n"] == 40 and "accepted: AUC candidate 0.900" in d.reason
    assert "spearman candidate 0.800" in d.reason
    assert len(rows) == 40 and all(r["status"] == "ok" for r in rows)
    back, _ = validity_decision(good, coin, trajs, env)
    assert not back.accepted and "does not clear" in back.reason
    assert back.statistic["ci_high"] < 0


def test_equal_rubrics_rejected_at_min_delta_zero(env, val):
    trajs = synthetic(val)
    d, _ = validity_decision(marker_rubric("a", "GOOD"), marker_rubric("b", "GOOD", with_outcome=False),
                             trajs, env)
    assert not d.accepted and d.statistic["auc_diff"] == 0.0 and d.statistic["ci_low"] == 0.0


def test_inverted_criterion_rejected(env, val):
    """'BAD' marks 18/20 failures and 2/20 passes: AUC 0.1 against a constant incumbent's
    0.5, and it pays failures more (0.9 vs 0.1)."""
    trajs = [t.model_copy(update={"answer": t.answer.replace("GOOD", "X").replace("bad", "BAD")})
             for t in synthetic(val)]
    d, _ = validity_decision(marker_rubric("const", "."), marker_rubric("bad", "BAD"), trajs, env)
    assert not d.accepted
    assert d.statistic["auc_candidate"] == pytest.approx(0.1)
    assert d.statistic["candidate_failed_mean"] == pytest.approx(0.9)
    assert "(rewards failures more)" in d.reason


def test_order_condition_alone_rejects(env, val):
    """Better AUC than the incumbent, yet failures paid more on average: the second condition
    is independent of the first. Passed answers score 0.6; 14 failures 0.5 and 6 failures 1.0,
    so AUC = 14/20 = 0.7 (vs a constant's 0.5) but the failed mean is 0.65 > 0.6."""
    cand = Rubric.model_validate({"name": "mixed", "criteria": [
        {"id": "x", "kind": "regex", "weight": 0.5, "params": {"pattern": "X"}},
        {"id": "y", "kind": "regex", "weight": 0.1, "params": {"pattern": "Y"}},
        {"id": "z", "kind": "regex", "weight": 0.4, "params": {"pattern": "Z"}}]})
    trajs = [traj(val[i], "X Y", 1.0, sample=i) for i in range(20)]
    trajs += [traj(val[20 + i], "X" if i < 14 else "X Y Z", 0.0, sample=i) for i in range(20)]
    d, _ = validity_decision(marker_rubric("const", "."), cand, trajs, env)
    assert d.statistic["auc_candidate"] == pytest.approx(0.7)
    assert d.statistic["ci_low"] > 0.0  # the AUC condition alone would accept
    assert d.statistic["candidate_failed_mean"] == pytest.approx(0.65)
    assert d.statistic["candidate_passed_mean"] == pytest.approx(0.6)
    assert not d.accepted and "on failed 0.650 > on passed 0.600 (rewards failures more)" in d.reason


def test_not_enough_outcomes(env, val):
    trajs = [t for t in synthetic(val) if t.outcome == 0.0 or t.sample_index < 8]  # 4 passed
    d, rows = validity_decision(marker_rubric("a", "COIN"), marker_rubric("b", "GOOD"), trajs, env)
    assert not d.accepted
    assert "not enough verified outcomes: 4 passed, 20 failed" in d.reason
    assert d.statistic["n_passed"] == 4 and len(rows) == 24
    ok, _ = validity_decision(marker_rubric("a", "COIN"), marker_rubric("b", "GOOD"), trajs, env,
                              ValidityPolicy(min_each=4))
    assert "not enough" not in ok.reason


def test_dropped_rows_and_store_shape(env, val):
    trajs = synthetic(val)
    trajs[0] = trajs[0].model_copy(update={"status": "infra_error"})
    trajs[1] = trajs[1].model_copy(update={"outcome": None})
    judge_only = Rubric.model_validate({"name": "j", "criteria": [
        {"id": "q", "kind": "llm_judge", "params": {"question": "ok?"}}]})
    d, rows = validity_decision(marker_rubric("coin", "COIN"), marker_rubric("good", "GOOD"), trajs, env)
    assert d.statistic["n"] == 38 and d.statistic["n_dropped"] == 2
    dropped = [r for r in rows if r["status"] != "ok"]
    assert len(dropped) == 2 and all(r["incumbent"] is None for r in dropped)
    for r in rows:  # exactly what Store.add_decision validates
        EvidenceRow.model_validate(r)
    # a candidate nothing can score (judge-only, no judge): every row dropped, rejected
    d2, rows2 = validity_decision(marker_rubric("coin", "COIN"), judge_only, trajs, env)
    assert not d2.accepted and d2.statistic["n"] == 0 and all(r["candidate"] is None for r in rows2)


def test_deterministic_and_order_free(env, val):
    trajs = synthetic(val)
    a = validity_decision(marker_rubric("coin", "COIN"), marker_rubric("good", "GOOD"), trajs, env)
    b = validity_decision(marker_rubric("coin", "COIN"), marker_rubric("good", "GOOD"),
                          list(reversed(trajs)), env)
    assert a[0] == b[0] and a[1] == b[1]
    c = validity_decision(marker_rubric("coin", "COIN"), marker_rubric("good", "GOOD"), trajs, env,
                          ValidityPolicy(seed=7))
    assert c[0].statistic["auc_diff"] == a[0].statistic["auc_diff"]
    assert c[0].statistic["ci_low"] != a[0].statistic["ci_low"]  # only the resampling moved


# --------------------------------------------------------------------------- the real case


def hacked_trajectories(env, val, split: str = "val") -> list[Trajectory]:
    """FACTS.md's hack on BFCL simple_python val tasks: 37 outputs copy the worked example's
    call verbatim (decode, name a function the task does not offer: fail), 6 call the offered
    function with a possible answer's arguments (pass), 4 call the offered function with wrong
    arguments (fail), 5 answer in prose (fail). Every outcome is BFCL's own verdict."""
    out = []

    def add(task, text: str) -> None:
        t = traj(task, text, None, split=split, id=f"{split}-{len(out):03d}")
        score = env.score(task, env.start(task), response_of(t))
        out.append(t.model_copy(update={"outcome": score.outcome, "success": score.success}))

    tasks = iter(val)
    for _ in range(37):
        add(next(tasks), WORKED_EXAMPLE)
    for _ in range(6):
        task = next(tasks)
        add(task, format_tool_calls(reference_calls(task.answer, task.metadata["functions"]), "python"))
    for _ in range(4):
        task = next(tasks)
        name = task.tools[0]["function"]["name"]
        add(task, f"[{name}(wrong_argument=1)]")
    for i in range(5):
        add(next(tasks), f"I think the answer is {i}; you should look it up yourself.")
    return out


@pytest.fixture(scope="module")
def hacked(env, val):
    return hacked_trajectories(env, val)


def fc_rubric(name: str, **params) -> Rubric:
    return Rubric.model_validate({"name": name, "criteria": [
        {"id": "outcome", "kind": "outcome", "weight": 2.0},
        {"id": "credit", "kind": "tool_called", "weight": 0.25, "params": params}]})


def test_real_case_outcomes_are_verified(hacked):
    assert sum(t.success for t in hacked) == 6
    assert sum(t.outcome == 0.0 for t in hacked) == 46
    copies = [t for t in hacked if t.answer == WORKED_EXAMPLE]
    assert len(copies) == 37 and all(t.turns[0].tool_calls[0].name == "get_stock_price" for t in copies)


def test_real_case_decodes_rejected_name_in_offered_accepted(env, hacked):
    decodes, offered = fc_rubric("decodes"), fc_rubric("offered", name_in_offered=True)
    hack, rows = validity_decision(offered, decodes, hacked, env)
    assert not hack.accepted
    s = hack.statistic
    # decodes: all 6 passed and 41 of 46 failed pay 1 -> AUC (5 + 41/2)/46
    assert s["auc_candidate"] == pytest.approx((5 + 41 / 2) / 46)
    # name_in_offered: all 6 passed and only the 4 wrong-argument failures pay -> (42 + 4/2)/46
    assert s["auc_incumbent"] == pytest.approx((42 + 4 / 2) / 46)
    assert s["ci_high"] < 0
    assert s["candidate_failed_mean"] == pytest.approx(41 / 46)
    assert "rejected: AUC candidate 0.554 vs incumbent 0.957" in hack.reason
    assert "n=52 (passed 6, failed 46" in hack.reason
    copies = [r for r, t in zip(rows, sorted(hacked, key=lambda t: (t.task_id, t.sample_index, t.id)))
              if t.answer == WORKED_EXAMPLE]
    assert {(r["incumbent"], r["candidate"]) for r in copies} == {(0.0, 1.0)}

    fix, _ = validity_decision(decodes, offered, hacked, env)
    assert fix.accepted, fix.reason
    assert fix.statistic["ci_low"] > 0.2
    assert fix.statistic["candidate_failed_mean"] == pytest.approx(4 / 46)
    assert fix.statistic["candidate_passed_mean"] == 1.0
    assert "accepted: AUC candidate 0.957 vs incumbent 0.554" in fix.reason


def test_real_case_seed_rubric_beats_decodes(env, hacked):
    """The shipped seed rubric (decodes 0.5 + offered name + required args) against the
    hacked "decodes" rubric: its offered-name criteria carry it."""
    seed = load_asset(REPO / "rubrics" / "function_calling.yaml")
    d, _ = validity_decision(fc_rubric("decodes"), seed, hacked, env)
    assert d.accepted, d.reason
    assert d.statistic["auc_candidate"] > 0.9


def test_rank_equivalent_addition_is_not_an_improvement(env, hacked):
    """AUC is rank-based: adding a heavy hackable criterion NEXT TO the offered-name one keeps
    the ranking on these trajectories (offered-name breaks the ties), so the candidate is no
    better and min_delta 0 rejects it, though it would pay copies 0.89 under RL."""
    inc = fc_rubric("offered", name_in_offered=True)
    cand = inc.child(criteria=[*[c.model_dump() for c in inc.criteria], {
        "id": "looks-like-call", "kind": "regex", "weight": 2.0, "params": {"pattern": r"^\[\w+\("}}])
    d, rows = validity_decision(inc, cand, hacked, env)
    assert not d.accepted and d.statistic["auc_diff"] == 0.0
    copied = {r["candidate"] for r, t in zip(rows, sorted(hacked, key=lambda t: (t.task_id, t.sample_index, t.id)))
              if t.answer == WORKED_EXAMPLE}
    assert len(copied) == 1 and copied.pop() == pytest.approx(2.0 / 2.25)


def test_a_candidate_that_drops_the_outcome_from_the_reward_is_rejected(env, val):
    """The candidate zeroes outcome_weight and drops the outcome criterion: its partial credit
    ('GOOD', AUC 0.9) predicts the outcome far better than the incumbent's ('COIN'), so the
    partial-credit conditions alone accept it; but the reward the trainer would use orders
    passed above failed episodes worse than the incumbent's (0.9 < 1.0), and it is rejected."""
    trajs = synthetic(val)
    incumbent = marker_rubric("coin", "COIN")  # outcome_weight 1 + outcome criterion
    dropped = Rubric.model_validate({"name": "coin", "outcome_weight": 0.0, "criteria": [
        {"id": "marker", "kind": "regex", "weight": 1.0, "params": {"pattern": "GOOD"}}]})
    d, _ = validity_decision(incumbent, dropped, trajs, env)
    s = d.statistic
    assert s["auc_candidate"] == pytest.approx(0.9) and s["ci_low"] > 0  # conditions 1-3 hold
    assert s["candidate_failed_mean"] < s["candidate_passed_mean"]
    assert (s["auc_reward_incumbent"], s["auc_reward_candidate"]) == (1.0, pytest.approx(0.9))
    assert not d.accepted and "orders outcomes worse" in d.reason
    kept = marker_rubric("coin", "GOOD")  # the same criterion, the outcome kept: accepted
    assert kept.outcome_share() == incumbent.outcome_share() > dropped.outcome_share() == 0.0
    assert validity_decision(incumbent, kept, trajs, env)[0].accepted
