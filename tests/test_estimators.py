"""Advantage estimators (coevo/rl/estimators/): hand-computed credit on scripted batches."""

from __future__ import annotations

import pytest
import torch

from coevo.assets.rubric import Rubric
from coevo.envs.base import Score, Task
from coevo.errors import AssetError, CoevoError
from coevo.rl.batch import make_microbatch, plan_grpo
from coevo.rl.config import TrainConfig
from coevo.rl.estimators import Credit, EstimatorContext, make_estimator, token_advantages
from coevo.rl.estimators.progress import progress_curves
from coevo.rl.grpo import policy_loss
from coevo.trajectory import ToolCall, ToolResult, Trajectory, Turn

PROMPT = [1, 2, 3]


def episode(tid: str, group: str, steps: list[tuple[int, list[int]]], reward: float,
            task: str = "t") -> Trajectory:
    """A scripted multi-turn episode: the prompt, then per turn (action token, observation
    tokens that follow it). Each action is one sampled token (mask 1, log-prob -1)."""
    ids, mask, turns = list(PROMPT), [0] * len(PROMPT), []
    for k, (action, obs) in enumerate(steps):
        turns.append(Turn(index=k, start=len(ids), end=len(ids) + 1, text=str(action)))
        ids, mask = ids + [action] + obs, mask + [1] + [0] * len(obs)
    return Trajectory(id=tid, env="scripted", task_id=task, group_id=group, token_ids=ids,
                      loss_mask=mask, logprobs=[-1.0 * m for m in mask],
                      prompt_len=len(PROMPT), turns=turns, reward=reward)


def batch() -> list[Trajectory]:
    # a and b reach the same observation [20] after different actions; c reaches [21].
    return [episode("a", "g", [(10, [20]), (30, [])], 1.0),
            episode("b", "g", [(11, [20]), (31, [])], 0.0),
            episode("c", "g", [(12, [21]), (32, [])], 0.0)]


def credits(name: str, trajs, scale="none", **options) -> dict[str, Credit]:
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    est = make_estimator(name, options, scale=scale, eps=0.0)
    out = est.credit(groups)
    return {t.id: c for gid in groups for t, c in zip(groups[gid], out[gid])}


# -- grpo -------------------------------------------------------------------------------------
def test_grpo_gives_the_group_relative_episode_advantage_to_every_token():
    c = credits("grpo", batch())
    assert c["a"] == Credit(pytest.approx(2 / 3)) and c["b"].episode == pytest.approx(-1 / 3)
    assert c["a"].turns is None
    plan = plan_grpo(batch(), scale="none")
    assert [s.advantage for s in plan.samples] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert all(s.token_adv is None for s in plan.samples)  # the per-sequence fast path


# -- gigpo ------------------------------------------------------------------------------------
def test_gigpo_step_advantages_by_observation_anchor_hand_computed():
    # Episode level (scale none): rewards [1, 0, 0], mean 1/3 -> A^E = [2/3, -1/3, -1/3].
    # Turn 0: all three start from the prompt; returns gamma^1 R = [0.5, 0, 0], mean 1/6
    #   -> A^S = [1/3, -1/6, -1/6].
    # Turn 1: a and b share observation [20]: returns [1, 0] -> [0.5, -0.5]; c alone -> 0.
    c = credits("gigpo", batch(), gamma=0.5, weight=1.0)
    assert c["a"].turns == pytest.approx((2 / 3 + 1 / 3, 2 / 3 + 0.5))
    assert c["b"].turns == pytest.approx((-1 / 3 - 1 / 6, -1 / 3 - 0.5))
    assert c["c"].turns == pytest.approx((-1 / 3 - 1 / 6, -1 / 3))
    # weight 0.5 halves the step part only
    h = credits("gigpo", batch(), gamma=0.5, weight=0.5)
    assert h["b"].turns == pytest.approx((-1 / 3 - 1 / 12, -1 / 3 - 0.25))


def test_gigpo_history_anchor_compares_only_identical_prefixes():
    # Turn 1's prefixes differ (different actions), so only turn 0 gets step credit.
    c = credits("gigpo", batch(), gamma=0.5, anchor="history")
    assert c["a"].turns == pytest.approx((1.0, 2 / 3))
    assert c["c"].turns == pytest.approx((-0.5, -1 / 3))


def test_gigpo_std_scaling_within_anchor_groups():
    # Turn 1 anchor [20]: returns [1, 0], population std 0.5 -> A^S = [1, -1].
    # Episode: [1, 0, 0] / std sqrt(2)/3 -> [sqrt 2, -1/sqrt 2, -1/sqrt 2].
    c = credits("gigpo", batch(), scale="std", gamma=0.5)
    s2 = 2 ** 0.5
    assert c["a"].episode == pytest.approx(s2)
    assert c["a"].turns[1] == pytest.approx(s2 + 1.0)
    assert c["b"].turns[1] == pytest.approx(-1 / s2 - 1.0)


def test_gigpo_finds_signal_in_a_group_grpo_skips():
    # Both episodes succeed, one in two turns, one in one: equal rewards, no GRPO signal; the
    # anchor at the prompt prefers the direct answer (return 1 vs gamma = 0.5).
    trajs = [episode("long", "h", [(10, [20]), (30, [])], 1.0),
             episode("short", "h", [(11, [])], 1.0)]
    assert plan_grpo(trajs).groups == []
    est = make_estimator("gigpo", {"gamma": 0.5}, scale="none", eps=0.0)
    plan = plan_grpo(trajs, estimator=est)
    assert plan.signal_fraction == 1.0
    long, short = plan.samples
    # returns at the prompt [0.5, 1.0], mean 0.75 -> [-0.25, 0.25]; turn 1 of long alone -> 0
    assert long.token_adv.tolist() == pytest.approx([0, 0, 0, -0.25, 0, 0])
    assert short.token_adv.tolist() == pytest.approx([0, 0, 0, 0.25])


def test_turn_advantages_reach_the_loss_per_token():
    est = make_estimator("gigpo", {"gamma": 0.5}, scale="none", eps=0.0)
    plan = plan_grpo(batch(), estimator=est)
    mb = make_microbatch(plan.samples)  # plain layout: window from position 3
    assert mb.start == 3 and mb.advantages.shape == mb.mask.shape
    # a's tokens: turn 0 at position 3, turn 1 at position 5
    assert mb.advantages[0, 0] == pytest.approx(1.0) and mb.advantages[0, 2] == pytest.approx(7 / 6)
    # At ratio 1, d loss / d logp = -A / tokens on every policy token.
    new = mb.old_logp.clone().requires_grad_(True)
    loss, _ = policy_loss(new, mb.old_logp, None, mb.advantages, mb.mask, denom=6.0)
    loss.backward()
    expect = -torch.tensor([[1.0, 0, 7 / 6], [-0.5, 0, -5 / 6], [-0.5, 0, -1 / 3]]) / 6.0
    assert torch.allclose(new.grad, expect, atol=1e-6)


def test_token_advantages_refuses_a_credit_of_the_wrong_length():
    with pytest.raises(CoevoError, match="1 turn advantages for 2 turns"):
        token_advantages(batch()[0], Credit(0.0, (1.0,)))


# -- configuration ----------------------------------------------------------------------------
def test_config_names_the_estimator_field():
    assert TrainConfig().estimator == "grpo"
    with pytest.raises(AssetError, match=r"^train.yaml: estimator: .*unknown advantage "
                                         r"estimator 'gipgo'; known: gigpo, grpo"):
        TrainConfig.from_mapping({"estimator": "gipgo"}, "train.yaml")
    with pytest.raises(AssetError, match=r"^train.yaml: estimator_options: .*gamma: .*"
                                         r"\(advantage estimator 'gigpo'\)"):
        TrainConfig.from_mapping({"estimator": "gigpo", "estimator_options": {"gamma": 2}},
                                 "train.yaml")
    with pytest.raises(AssetError, match=r"estimator_options: .*gama"):
        TrainConfig.from_mapping({"estimator": "gigpo", "estimator_options": {"gama": 0.5}},
                                 "train.yaml")


# -- progress ---------------------------------------------------------------------------------
class CounterEnv:
    """Multi-turn: each executed `inc` call adds 1; success = two incs and an answer "done".
    Details: half = 1 once one inc happened."""

    name, single_turn = "counter", False
    TASK = Task(id="t", env="counter", messages=[{"role": "user", "content": "count to 2"}],
                tools=[{"name": "inc", "parameters": {"type": "object", "properties": {}}}])

    def tasks(self, split, n=None):
        return [self.TASK]

    def start(self, task):
        return {"n": 0}

    def step(self, state, calls):
        state["n"] += len(calls)
        return [ToolResult(name=c.name, content=str(state["n"])) for c in calls]

    def score(self, task, state, response):
        ok = state["n"] >= 2 and "done" in response.text
        return Score(outcome=float(ok), success=ok, details={"half": float(state["n"] >= 1)})


RUBRIC = Rubric.model_validate({"name": "counting", "criteria": [
    {"id": "solved", "kind": "outcome", "weight": 1.0},
    {"id": "half", "kind": "outcome", "weight": 2.0, "params": {"detail": "half"}},
    {"id": "says-done", "kind": "regex", "weight": 1.0,
     "params": {"pattern": "done", "target": "text"}},
    # not verifier-backed: left out (it would raise without a judge if it were scored)
    {"id": "polite", "kind": "llm_judge", "weight": 5.0, "params": {"question": "Polite?"}}]})


def counter_episode(tid: str, texts: list[str], reward: float) -> Trajectory:
    ids, mask, turns = [1, 2, 3], [0, 0, 0], []
    for k, text in enumerate(texts):
        inc = text == "inc"
        turns.append(Turn(index=k, start=len(ids), end=len(ids) + 1, text=text,
                          tool_calls=[ToolCall(name="inc")] if inc else [],
                          tool_results=[ToolResult(name="inc", content="")] if inc else []))
        ids, mask = ids + [10 + k, 50], mask + [1, 0]
    return Trajectory(id=tid, env="counter", task_id="t", group_id="g", token_ids=ids,
                      loss_mask=mask, logprobs=[-1.0 * m for m in mask], prompt_len=3,
                      turns=turns, answer=texts[-1], reward=reward, outcome=reward)


def test_progress_credits_each_turn_with_the_change_in_checks_passed():
    # Checks (weights): solved 1, half 2, says-done 1; total 4.
    # win (inc, inc, done): P = [0, 2/4, 2/4, 4/4] -> D = [0.5, 0, 0.5]
    # lose (inc, done), n = 1: P = [0, 2/4, 3/4] -> D = [0.5, 0.25]
    # episode (scale none): rewards [1, 0] -> [0.5, -0.5]
    trajs = [counter_episode("win", ["inc", "inc", "done"], 1.0),
             counter_episode("lose", ["inc", "done"], 0.0)]
    est = make_estimator("progress", scale="none", eps=0.0,
                         context=EstimatorContext(env=CounterEnv(), rubric=RUBRIC))
    win, lose = est.credit({"g": trajs})["g"]
    assert win.turns == pytest.approx((1.0, 0.5, 1.0))
    assert lose.turns == pytest.approx((0.0, -0.25))
    assert progress_curves(trajs, CounterEnv(), RUBRIC) == [
        pytest.approx([0, 0.5, 0.5, 1.0]), pytest.approx([0, 0.5, 0.75])]


def test_progress_without_rubric_uses_the_verifier_outcome_and_finds_signal_in_failed_groups():
    # Both fail: no episode signal. Outcome-only progress is 0 at every state: still none.
    a = counter_episode("a", ["inc", "done"], 0.0)
    b = counter_episode("b", ["done"], 0.0)
    ctx = EstimatorContext(env=CounterEnv(), rubric=None)
    plan = plan_grpo([a, b], estimator=make_estimator("progress", context=ctx))
    assert plan.groups == []
    # With the rubric, a's first turn made verified progress (half): D = [0.5, 0.25] for a,
    # [0.25] for b (says-done); episode advantages 0; weight 2.
    ctx = EstimatorContext(env=CounterEnv(), rubric=RUBRIC)
    plan = plan_grpo([a, b], estimator=make_estimator("progress", {"weight": 2.0}, context=ctx))
    sa, sb = plan.samples
    assert sa.token_adv.tolist() == pytest.approx([0, 0, 0, 1.0, 0, 0.5, 0])
    assert sb.token_adv.tolist() == pytest.approx([0, 0, 0, 0.5, 0])


def test_progress_needs_the_environment():
    with pytest.raises(CoevoError, match="needs the environment"):
        make_estimator("progress").credit({"g": batch()})


def test_progress_counts_checks_as_the_predicates_rubric_pays_them():
    # says-done now requires half: b's lone "done" (no inc) passes the regex but is not paid,
    # so its turn made no progress (0 instead of 1/4); a's "done" after an inc is paid.
    data = RUBRIC.model_dump(mode="json")
    data["criteria"][2]["requires"] = ["half"]
    ctx = EstimatorContext(env=CounterEnv(), rubric=Rubric.model_validate(data))
    a = counter_episode("a", ["inc", "done"], 0.0)
    b = counter_episode("b", ["done"], 0.0)
    ca, cb = make_estimator("progress", context=ctx).credit({"g": [a, b]})["g"]
    assert ca.turns == pytest.approx((0.5, 0.25)) and cb.turns == (0.0,)
