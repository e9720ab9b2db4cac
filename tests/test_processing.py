"""RL consistency under structured decoding: the behaviour log-probs stored with a trajectory
(tempered, top-k / top-p filtered, grammar-masked) equal the trainer's recomputation, so the
first update's PPO ratio is 1; grammar-forced tokens carry no gradient."""

from __future__ import annotations

import copy

import pytest
import torch

from coevo.agent.episode import run_episodes_sync
from coevo.assets.harness import Harness
from coevo.envs.base import Response, Score, Task
from coevo.rl import TrainConfig, Trainer, TrajectoryError
from coevo.rl.batch import make_microbatch, to_sample
from coevo.rl.grpo import policy_loss
from coevo.rl.processing import TokenProcessing
from coevo.rl.stage import live_policy
from coevo.rl.trainer import window_logprobs
from tiny_glue import SingleTurnEnv, load_tiny_model, save_tiny_model

torch.set_num_threads(1)

PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "required": ["color"], "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "bold": {"type": "boolean"}}}}}


class PickEnv(SingleTurnEnv):
    name = "test:pick"

    def tasks(self, split="train", n=None):
        out = [Task(id=f"{split}-{i}", env=self.name, tools=[PICK],
                    messages=[{"role": "user", "content": f"Say something about {i}."}])
               for i in range(4)]
        return out[:n] if n is not None else out

    def score(self, task, state, response: Response) -> Score:
        ok = any(c.arguments.get("color") == "red" for c in response.tool_calls)
        return Score(outcome=float(ok), success=ok)


def harness(constrain="tool_calls") -> Harness:
    return Harness.model_validate({
        "name": "pick", "system_prompt": "Call pick.", "tool_format": "python",
        "workflow": {"answer_extraction": {"method": "tool_call"}},
        "decoding": {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_new_tokens": 24,
                     "constrain": constrain}})


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    model, tok = load_tiny_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))
    cfg = TrainConfig(lr=1e-2, lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]})
    trainer = Trainer(model, cfg, tokenizer=tok)
    env = PickEnv()
    trajs = run_episodes_sync(env, env.tasks(), harness(), backend=live_policy(trainer, tok),
                              samples=4, seeds=3)
    return trainer, tok, trajs


def _samples(trainer, trajs):
    samples = [to_sample(t, 1.0) for t in trajs]
    trainer._replay_grammars(samples)
    return samples


def test_turns_record_how_they_were_sampled(rollouts):
    _, _, trajs = rollouts
    for t in trajs:
        assert t.status == "ok"
        [turn] = t.turns
        assert turn.constraint is not None and "pick(" in turn.constraint.text
        assert (turn.sampling.temperature, turn.sampling.top_k, turn.sampling.top_p) == (0.8, 20, 0.9)
    assert sum(t.success for t in trajs) not in (0, len(trajs))  # groups with signal


def test_stored_behaviour_logprobs_equal_the_trainers_recomputation(rollouts):
    trainer, _, trajs = rollouts
    samples = _samples(trainer, trajs)
    recomputed = trainer.sequence_logprobs(samples)
    for s, t, new in zip(samples, trajs, recomputed):
        stored = torch.tensor(t.logprobs) * s.mask
        torch.testing.assert_close(new, stored, atol=1e-5, rtol=0)
    # the raw distribution (what the trainer used to score) is a different quantity
    raw = copy.deepcopy(samples)
    for s in raw:
        s.processing = None
    gap = max(float((a - b).abs().max()) for a, b in
              zip(trainer.sequence_logprobs(raw), recomputed))
    assert gap > 0.05


def test_first_update_has_ratio_one(rollouts):
    trainer, _, trajs = rollouts
    before = {n: p.detach().clone() for n, p in trainer.named_trainable_parameters()}
    stats = trainer.step(trajs)
    assert stats.updated and stats.signal_groups > 0
    assert abs(stats.ratio_mean - 1.0) < 1e-5 and stats.clip_fraction == 0.0
    assert any(not torch.equal(p, before[n]) for n, p in trainer.named_trainable_parameters())


def test_forced_tokens_carry_no_gradient(rollouts):
    trainer, _, trajs = rollouts
    samples = _samples(trainer, trajs)
    forced, free = copy.deepcopy(samples), copy.deepcopy(samples)
    n_forced = 0
    for sf, sr in zip(forced, free):
        proc: TokenProcessing = sf.processing
        one = {p for p, row in proc.bitmask.items()
               if sum(bin(int(w) & 0xFFFFFFFF).count("1") for w in row) == 1}
        n_forced += len(one)
        for p in range(sf.n):
            sf.mask[p] = float(sf.mask[p] > 0 and p in one)
            sr.mask[p] = float(sr.mask[p] > 0 and p not in one)
    assert n_forced > 20  # "pick(color=", quotes, brackets: the grammar dictates them

    def grads(samples):
        trainer.model.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        mb = make_microbatch(samples)
        logp = window_logprobs(trainer.model, mb)
        loss, _ = policy_loss(logp, logp.detach(), None, torch.ones(len(samples)), mb.mask)
        loss.backward()
        return [p.grad for p in trainer.trainable_parameters()]

    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads(forced))
    assert any(g is not None and float(g.abs().max()) > 0.0 for g in grads(free))
    trainer.optimizer.zero_grad(set_to_none=True)


def test_constrained_turns_need_the_trainers_tokenizer(rollouts):
    trainer, _, trajs = rollouts
    blind = Trainer.__new__(Trainer)
    blind.__dict__.update(trainer.__dict__)
    blind.tokenizer, blind._grammars = None, None
    with pytest.raises(TrajectoryError, match="turns.constraint.*tokenizer"):
        blind._replay_grammars([to_sample(t, 1.0) for t in trajs])


def test_a_token_the_grammar_rejects_is_a_named_error(rollouts):
    trainer, tok, trajs = rollouts
    t = trajs[0]
    turn = t.turns[0]
    ids = list(t.token_ids)
    ids[turn.start] = tok.encode("Z", add_special_tokens=False)[0]  # not "["
    bad = t.model_copy(update={"token_ids": ids})
    with pytest.raises(TrajectoryError, match="not allowed by the grammar"):
        trainer._replay_grammars([to_sample(bad, 1.0)])


def test_per_task_temperatures_are_recorded_and_match_the_trainers_recomputation(rollouts):
    """The tempered schedule samples each task at its own temperature (EpisodeJob /
    run_episodes `temperatures`): every turn records it and the trainer scores with it."""
    trainer, tok, _ = rollouts
    env = PickEnv()
    temps = {"train-0": 0.4, "train-1": 1.3, "train-2": 0.8, "train-3": 1.9}
    trajs = run_episodes_sync(env, env.tasks(), harness(), backend=live_policy(trainer, tok),
                              samples=2, seeds=5, temperatures=temps)
    assert all(t.status == "ok" for t in trajs)
    assert {(t.task_id, turn.sampling.temperature) for t in trajs for turn in t.turns} == \
        set(temps.items())
    samples = _samples(trainer, trajs)
    recomputed = trainer.sequence_logprobs(samples)
    for s, t, new in zip(samples, trajs, recomputed):
        torch.testing.assert_close(new, torch.tensor(t.logprobs) * s.mask, atol=1e-5, rtol=0)
    # Scored at the harness's 0.8 instead, the 0.4 and 1.9 tasks' log-probs are off.
    at_harness = [t.model_copy(update={"turns": [u.model_copy(update={"sampling": u.sampling.model_copy(
        update={"temperature": 0.8})}) for u in t.turns]}) for t in trajs]
    wrong = trainer.sequence_logprobs(_samples(trainer, at_harness))
    gaps = {t.task_id: float((a - b).abs().max()) for t, a, b in zip(trajs, wrong, recomputed)}
    assert gaps["train-2"] < 1e-5 and min(gaps["train-0"], gaps["train-3"]) > 0.05
