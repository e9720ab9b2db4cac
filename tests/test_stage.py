"""The RL stage on a tiny random Llama (rollouts on the trainer's live model) and a trivially
learnable environment: parameters change, checkpoints are stored with their sha256 and
lineage, trajectories carry the asset and checkpoint ids, resume equals an uninterrupted run,
untrainable rollouts are refused and infrastructure failures are excluded and counted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from coevo.errors import CoevoError
from coevo.executors import AgentAssets
from coevo.models.hf import error_completion
from coevo.models.scripted import ScriptedBackend
from coevo.rl import TrainConfig, Trainer
from coevo.rl.lora import file_sha256
from coevo.rl.stage import StageConfig, UniformSampler, live_policy, rl_stage, trajectory_id
from coevo.store import Store
from tiny_glue import FirstCharEnv, load_tiny_model, save_tiny_model, tiny_harness

torch.set_num_threads(1)  # tiny models run slower with more threads on a shared 2-core box

ASSETS = AgentAssets(harness=tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 4}))
TRAIN = dict(seed=0, lr=2e-2, lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def fresh(tiny_dir):
    """A new model, tokenizer and trainer, as a new process would build them."""
    model, tok = load_tiny_model(tiny_dir)
    return Trainer(model, TrainConfig(**TRAIN), base_model="tiny"), tok


def open_run(path: Path, name: str = "r") -> Store:
    store = Store.open(f"sqlite:///{path}")
    if name not in [r.name for r in store.runs()]:
        store.create_run(name)
        store.start_round(name, 0)
    return store


def params(trainer):
    return {n: p.detach().clone() for n, p in trainer.named_trainable_parameters()}


def test_stage_trains_stores_trajectories_and_checkpoints(tiny_dir, tmp_path):
    store = open_run(tmp_path / "s.db")
    trainer, tok = fresh(tiny_dir)
    before = params(trainer)
    logs = []
    cfg = StageConfig(steps=3, tasks_per_step=3, samples=4, checkpoint_every=2, seed=1)
    res = rl_stage(store, "r", 0, FirstCharEnv(), ASSETS, trainer, cfg, tokenizer=tok,
                   on_step=logs.append)
    assert trainer.step_count == 3 and (res.start_step, res.end_step) == (0, 3)
    after = params(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)

    # checkpoints at steps 2 and 3 (the last step), beside the store: s.artifacts/<run id>/
    c2, c3 = (store.get_checkpoint(i) for i in res.checkpoints)
    assert (c2.step, c3.step) == (2, 3) and c3.parent == c2.id and c2.parent is None
    assert res.checkpoint == c3.id and store.latest_checkpoint("r").id == c3.id
    run_id = store.get_run("r").id
    for c in (c2, c3):
        assert Path(c.path) == tmp_path / "s.artifacts" / run_id / "checkpoints" / f"step-{c.step}"
        assert c.sha256 == file_sha256(Path(c.path) / "adapter_model.safetensors")
        assert c.harness == ASSETS.harness.hash and c.base_model == "tiny" and c.round == 0
    assert c2.sha256 != c3.sha256

    trajs = store.trajectories(run="r", round=0)
    assert len(trajs) == 3 * 3 * 4 and all(t.split == "train" and t.trainable for t in trajs)
    assert all(t.harness == ASSETS.harness.hash for t in trajs)
    steps = [trajs[k * 12:(k + 1) * 12] for k in range(3)]
    assert [{t.model for t in s} for s in steps] == [{"tiny@step-0"}, {"tiny@step-1"}, {"tiny@step-2"}]
    # steps 0-1 sampled from the base (no checkpoint yet); step 2 from the policy saved as c2;
    # policy_step names the exact weights: a rollout of step s saw s updates (c2 = 2 updates)
    assert [{t.checkpoint for t in s} for s in steps] == [{None}, {None}, {c2.id}]
    assert [{t.policy_step for t in s} for s in steps] == [{0}, {1}, {2}]
    assert steps[2][0].policy_step == c2.step
    run_id = store.get_run("r").id
    assert steps[1][0].id == trajectory_id(run_id, 0, 1, steps[1][0].task_id, 0)
    # the logged reward is the stored rollouts' mean reward
    for log, s in zip(logs, steps):
        assert log.reward_mean == pytest.approx(sum(t.reward for t in s) / len(s))
        assert log.rollouts == 12 and log.tokens_sampled == sum(t.sampled_tokens for t in s)
    assert [log.checkpoint for log in logs] == [None, c2.id, c3.id]
    assert any(log.signal_fraction > 0 and log.updated for log in logs)
    budget = store.budget_totals("r")
    # tokens: prefilled + generated (every token of each sequence); train_tokens: trained ones
    assert budget["rollouts"] == 36 and budget["tokens"] == sum(len(t.token_ids) for t in trajs)
    assert budget["train_tokens"] == sum(len(t.token_ids) for t in trajs if t.trainable) > 0
    assert budget["seconds"] > 0


class Crash(Exception):
    pass


@pytest.mark.parametrize("crash_after", [3, 4])
def test_resume_equals_an_uninterrupted_run(tiny_dir, tmp_path, crash_after):
    """The crash is raised by the step log callback, inside the transaction that commits the
    step (its checkpoint row, budget charge and log): that step is lost with its checkpoint
    (step 4) or had none (step 3), its rollouts are stored; the resumed stage redoes steps 3
    and 4 from the checkpoint of step 2, charging each step once."""
    cfg = StageConfig(steps=4, tasks_per_step=2, samples=4, checkpoint_every=2, seed=3,
                      checkpoint_dir=str(tmp_path / "ckpt-a"))
    store = open_run(tmp_path / "a.db", "a")
    trainer, tok = fresh(tiny_dir)
    rl_stage(store, "a", 0, FirstCharEnv(), ASSETS, trainer, cfg, tokenizer=tok)
    straight = params(trainer)
    want = [(t.task_id, t.sample_index, t.reward, t.token_ids) for t in store.trajectories(run="a")]

    cfg_b = cfg.model_copy(update={"checkpoint_dir": str(tmp_path / "ckpt-b")})
    db = tmp_path / "b.db"
    trainer, tok = fresh(tiny_dir)

    def crash(log):
        if log.index == crash_after:  # the step's trajectories are stored, its commit is not
            raise Crash

    with pytest.raises(Crash):
        rl_stage(open_run(db, "b"), "b", 0, FirstCharEnv(), ASSETS, trainer, cfg_b,
                 tokenizer=tok, on_step=crash)
    store_b = open_run(db, "b")  # a new handle, model and trainer: a restarted process
    trainer, tok = fresh(tiny_dir)
    res = rl_stage(store_b, "b", 0, FirstCharEnv(), ASSETS, trainer, cfg_b, tokenizer=tok,
                   resume=True)
    assert res.resumed_from is not None and store_b.get_checkpoint(res.resumed_from).step == 2
    assert (res.start_step, res.end_step, trainer.step_count) == (0, 4, 4)
    assert [s.step for s in res.steps] == [3, 4]
    resumed = params(trainer)
    for n in straight:
        torch.testing.assert_close(resumed[n], straight[n], rtol=0, atol=1e-6)
    got = [(t.task_id, t.sample_index, t.reward, t.token_ids) for t in store_b.trajectories(run="b")]
    assert got == want  # same rollouts, none stored twice
    assert [store_b.get_checkpoint(c).step for c in res.checkpoints] == [4]
    assert {k: v for k, v in store_b.budget_totals("b").items() if k != "seconds"} == {
        k: v for k, v in store.budget_totals("a").items() if k != "seconds"}  # charged once
    # resuming a finished stage does nothing
    trainer, tok = fresh(tiny_dir)
    again = rl_stage(store_b, "b", 0, FirstCharEnv(), ASSETS, trainer, cfg_b, tokenizer=tok,
                     resume=True)
    assert again.steps == [] and trainer.step_count == 4


def test_untrainable_rollouts_are_refused(tiny_dir, tmp_path):
    store = open_run(tmp_path / "s.db")
    trainer, tok = fresh(tiny_dir)
    text_only = ScriptedBackend(lambda req, i: "hello", tokenizer=None, name="api")
    with pytest.raises(CoevoError, match="untrainable: backend 'api' returned no token ids"):
        rl_stage(store, "r", 0, FirstCharEnv(), ASSETS, trainer,
                 StageConfig(steps=1, tasks_per_step=2, samples=2), backend=text_only)
    assert trainer.step_count == 0 and store.trajectories(run="r") == []


class Flaky:
    """The live policy, except that every third request of a batch fails (a backend error)."""

    def __init__(self, inner):
        self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer
        self.failed = 0

    def generate(self, requests):
        keep = [i for i in range(len(requests)) if i % 3 != 0]
        out = self.inner.generate([requests[i] for i in keep])
        res = [[error_completion("backend timeout")] for _ in requests]
        for i, o in zip(keep, out):
            res[i] = o
        self.failed += len(requests) - len(keep)
        return res


def test_infra_failures_are_excluded_and_counted(tiny_dir, tmp_path):
    store = open_run(tmp_path / "s.db")
    trainer, tok = fresh(tiny_dir)
    flaky = Flaky(live_policy(trainer, tok))
    before = params(trainer)
    res = rl_stage(store, "r", 0, FirstCharEnv(), ASSETS, trainer,
                   StageConfig(steps=2, tasks_per_step=3, samples=4, seed=2), backend=flaky)
    stored = store.trajectories(run="r")
    failed = [t for t in stored if t.infra_failed]
    assert res.infra_failures == len(failed) == flaky.failed > 0
    assert all(t.reward is None and t.outcome is None for t in failed)
    assert sum(s.infra_failures for s in res.steps) == res.infra_failures
    after = params(trainer)  # the remaining samples still trained the policy
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_uniform_sampler_is_a_function_of_seed_and_step():
    tasks = FirstCharEnv().tasks("train")
    a, b = UniformSampler(tasks, seed=1), UniformSampler(tasks, seed=1)
    assert [t.id for t in a.sample(5, 4)] == [t.id for t in b.sample(5, 4)]
    assert [t.id for t in a.sample(5, 4)] != [t.id for t in a.sample(6, 4)]
    assert len({t.id for t in a.sample(0, 12)}) == 12
    with pytest.raises(CoevoError, match="tasks_per_step: 13"):
        a.sample(0, 13)


@pytest.mark.slow
def test_embedded_model_learns_the_answer_format(tmp_path):
    """SmolLM2-135M asked for a bare number mostly answers in prose; GRPO on a format-only
    reward raises the share of bare-number replies within a few steps."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coevo.models.embedded import embedded_model_dir
    from tiny_glue import NumberFormatEnv

    torch.set_num_threads(2)
    d = embedded_model_dir()
    model, tok = AutoModelForCausalLM.from_pretrained(str(d)), AutoTokenizer.from_pretrained(str(d))
    trainer = Trainer(model, TrainConfig(seed=0, lr=3e-3, lora={"rank": 8, "alpha": 16,
                                                                "target_modules": ["q_proj", "v_proj"]}),
                      base_model="smollm2-135m-instruct")
    assets = AgentAssets(harness=tiny_harness(
        system_prompt="You are a calculator.", answer_format="Reply with only the number.",
        decoding={"temperature": 0.8, "top_k": 40, "max_new_tokens": 4}))
    store = open_run(tmp_path / "s.db")
    res = rl_stage(store, "r", 0, NumberFormatEnv(), assets, trainer,
                   StageConfig(steps=6, tasks_per_step=2, samples=6, checkpoint_every=6, seed=0),
                   tokenizer=tok)
    rewards = [s.reward_mean for s in res.steps]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.15, rewards


def test_remote_executor_samples_with_the_latest_adapter_each_step(tiny_dir, tmp_path):
    """Rollouts on a separate engine (as vLLM or Ray workers are) that loads the adapter the
    stage publishes before every step give the same trajectories as the live policy."""
    from coevo.executors import LocalExecutor
    from coevo.models.hf import HFBackend

    cfg = StageConfig(steps=3, tasks_per_step=2, samples=4, checkpoint_every=3, seed=3)
    trainer, tok = fresh(tiny_dir)
    store = open_run(tmp_path / "a.db", "live")
    rl_stage(store, "live", 0, FirstCharEnv(), ASSETS, trainer, cfg, tokenizer=tok)
    live = store.trajectories(run="live", round=0)

    trainer2, _ = fresh(tiny_dir)
    engine = HFBackend.from_pretrained(str(tiny_dir), name="engine")
    loaded = []
    real_load = engine.load_adapter
    engine.load_adapter = lambda path: (loaded.append(Path(path).name), real_load(path))[1]
    store2 = open_run(tmp_path / "b.db", "remote")
    rl_stage(store2, "remote", 0, FirstCharEnv(), ASSETS, trainer2, cfg,
             executor=LocalExecutor(engine))
    remote = store2.trajectories(run="remote", round=0)

    assert loaded == ["step-0", "step-1", "step-2"]  # a fresh adapter before every step
    assert [t.token_ids for t in remote] == [t.token_ids for t in live]
    assert [t.reward for t in remote] == [t.reward for t in live]
    for a, b in zip(remote, live):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    p1, p2 = params(trainer), params(trainer2)
    assert all(torch.allclose(p1[n], p2[n], atol=1e-6) for n in p1)
    # only the current step's published adapter is kept
    rollout_dir = Path(engine.adapter).parent
    assert [p.name for p in rollout_dir.iterdir()] == ["step-2"]


def test_ray_executor_rolls_out_the_same_trajectories_as_the_live_policy(tiny_dir, tmp_path):
    """`coevo train --executor ray`: before every step the stage publishes the adapter, two
    actors of a local Ray (2 CPUs) load it and roll out their shards of the step's tasks. Same
    seeds give the same stored trajectories, and so the same trained weights, as rollouts on
    the live policy in this process."""
    import ray
    import ray.cloudpickle

    import tiny_glue
    from coevo.executors import BackendSpec, RayExecutor

    cfg = StageConfig(steps=2, tasks_per_step=2, samples=3, checkpoint_every=2, seed=5)
    trainer, tok = fresh(tiny_dir)
    store = open_run(tmp_path / "a.db", "live")
    res = rl_stage(store, "live", 0, FirstCharEnv(), ASSETS, trainer, cfg, tokenizer=tok)
    live = store.trajectories(run="live", round=0)
    # step 0 updated the weights, so step 1's rollouts need the published adapter to match
    assert res.steps[0].updated

    ray.cloudpickle.register_pickle_by_value(tiny_glue)  # the workers cannot import tests/
    ex = RayExecutor(BackendSpec(spec=f"hf:{tiny_dir}", options={"device": "cpu"}),
                     num_actors=2, num_cpus=2, object_store_memory=80 * 1024 * 1024)
    try:
        trainer2, _ = fresh(tiny_dir)
        store2 = open_run(tmp_path / "b.db", "ray")
        rl_stage(store2, "ray", 0, FirstCharEnv(), ASSETS, trainer2, cfg, executor=ex)
        held = ray.get([a.__ray_call__.remote(lambda w: w.backend.adapter) for a in ex._actors])
    finally:
        ex.close()
        ray.cloudpickle.unregister_pickle_by_value(tiny_glue)
    remote = store2.trajectories(run="ray", round=0)

    # both actors sampled step 1 with the adapter the stage published for it
    assert [Path(p).name for p in held] == ["step-1", "step-1"]
    key = lambda t: (t.policy_step, t.task_id, t.sample_index)  # noqa: E731
    live, remote = sorted(live, key=key), sorted(remote, key=key)
    assert len(remote) == len(live) == 2 * 2 * 3
    assert [key(t) + (t.seed, t.group_id) for t in remote] == [key(t) + (t.seed, t.group_id) for t in live]
    assert [t.token_ids for t in remote] == [t.token_ids for t in live]
    assert [t.loss_mask for t in remote] == [t.loss_mask for t in live]
    assert [(t.reward, t.outcome) for t in remote] == [(t.reward, t.outcome) for t in live]
    for a, b in zip(remote, live):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len({tuple(t.token_ids) for t in live}) > 6  # samples really differ
    p1, p2 = params(trainer), params(trainer2)
    assert all(torch.allclose(p1[n], p2[n], atol=1e-6) for n in p1)


def test_tempered_temperature_follows_the_stages_own_history(tiny_dir, tmp_path):
    store = open_run(tmp_path / "t.db")
    trainer, tok = fresh(tiny_dir)
    # pool of 2 tasks, both drawn every step; 3 samples: a posterior mean is never 1/2
    cfg = StageConfig(steps=2, tasks_per_step=2, samples=3, seed=1, pool_size=2,
                      temperature="tempered", temperature_options={"spread": 0.5})
    rl_stage(store, "r", 0, FirstCharEnv(), ASSETS, trainer, cfg, tokenizer=tok)
    trajs = store.trajectories(run="r", round=0)
    first = [t for t in trajs if t.policy_step == 0]
    second = [t for t in trajs if t.policy_step == 1]
    assert len(first) == len(second) == 6
    # step 0 has no history: the harness's temperature 1.0
    assert {u.sampling.temperature for t in first for u in t.turns} == {1.0}
    for t in second:
        losses = sum(not x.success for x in first if x.task_id == t.task_id)
        q = (1 + losses) / (2 + 3)  # Beta(1 + wins, 1 + losses): b / (a + b)
        expect = min(1.5, max(0.1, 1.0 + 0.5 * (2 * q - 1)))
        assert expect != pytest.approx(1.0)
        assert all(u.sampling.temperature == pytest.approx(expect) for u in t.turns)


def test_stage_binds_its_environment_and_rubric_for_the_progress_estimator(tiny_dir, tmp_path):
    store = open_run(tmp_path / "p.db")
    model, tok = load_tiny_model(tiny_dir)
    trainer = Trainer(model, TrainConfig(**TRAIN, estimator="progress"), base_model="tiny")
    env = FirstCharEnv()
    cfg = StageConfig(steps=1, tasks_per_step=2, samples=2, seed=1)
    res = rl_stage(store, "r", 0, env, ASSETS, trainer, cfg, tokenizer=tok)
    assert trainer.context.env is env and trainer.context.rubric is ASSETS.rubric
    assert res.end_step == 1 and trainer.step_count == 1
