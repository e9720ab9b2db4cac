"""evaluate(): episodes through an executor, every trajectory and result row stored, a summary
whose statistics treat infrastructure failures as missing data."""

from __future__ import annotations

import json

import pytest
import torch

from coevo.assets.rubric import Rubric
from coevo.errors import CoevoError
from coevo.evaluate import evaluate, summarize, t_interval
from coevo.executors import AgentAssets
from coevo.models.hf import HFBackend
from coevo.models.scripted import ScriptedBackend
from coevo.store import Store
from coevo.trajectory import Trajectory, Turn
from tiny_glue import EchoToolEnv, FirstCharEnv, load_tiny_model, save_tiny_model, tiny_harness, tiny_tokenizer

torch.set_num_threads(1)

RUBRIC = Rubric.model_validate({"name": "echo", "criteria": [
    {"id": "called", "kind": "outcome", "params": {"detail": "called"}}]})


def traj(task, sample, outcome, *, criteria=None, failed=False, turns=1, n=10, sampled=4):
    mask = [0] * (n - sampled) + [1] * sampled
    return Trajectory(env="e", task_id=task, sample_index=sample, token_ids=list(range(n)),
                      loss_mask=mask, status="infra_error" if failed else "ok",
                      outcome=None if failed else outcome, success=bool(outcome) and not failed,
                      reward=None if failed else outcome, criteria=criteria or {},
                      turns=[Turn(index=i, start=0, end=1, text="x") for i in range(turns)])


def test_summary_means_over_tasks_and_excludes_infra_failures():
    trajs = [traj("a", 0, 1.0, criteria={"c": 1.0}), traj("a", 1, 0.0, criteria={"c": 0.5}),
             traj("b", 0, 0.0, failed=True), traj("b", 1, 1.0, turns=3),
             traj("c", 0, 0.0, failed=True), traj("c", 1, 0.0, failed=True)]
    r = summarize(trajs, env="e", split="val", samples=2)
    # task means: a = 0.5, b = 1.0 (its failure is missing, not 0), c = missing entirely
    assert r.mean == pytest.approx(0.75) and r.n_tasks == 3 and r.n_tasks_missing == 1
    assert r.n_infra_failures == 3 and r.n_scored == 3 and r.n_episodes == 6
    assert r.success_rate == pytest.approx(0.75)
    assert r.criteria == {"c": pytest.approx(0.75)}
    assert r.mean_turns == pytest.approx(5 / 3)
    assert r.tokens_sampled == 24 and r.tokens_total == 60
    lo, hi = t_interval([0.5, 1.0])  # 0.75 +- 12.706 * 0.3536 / sqrt(2), clipped
    assert (r.ci_low, r.ci_high) == (lo, hi) == (0.0, 1.0)
    assert [t.outcome for t in r.tasks] == [0.5, 1.0, None]


def test_t_interval_matches_the_formula():
    lo, hi = t_interval([0.2, 0.4, 0.6, 0.8])
    # mean 0.5, sd 0.2582, t(0.975, 3) = 3.1824 -> half width 0.4108
    assert lo == pytest.approx(0.5 - 0.41082, abs=1e-4) and hi == pytest.approx(0.5 + 0.41082, abs=1e-4)
    assert t_interval([1.0]) == (None, None)


def echo_script(request, index):
    """Answers right for apple and river, wrong for stone, and the backend fails on cloud."""
    text = tiny_tokenizer().decode(request.prompt_ids, skip_special_tokens=False)
    word = next(w for w in EchoToolEnv.WORDS if f"Echo the word {w}." in text)
    if word == "cloud":
        return None  # the scripted backend's error completion: an infrastructure failure
    if "<|im_start|>tool" not in text:
        return json.dumps({"name": "echo", "arguments": {"text": word}})
    return f"I said {'pebble' if word == 'stone' else word}."


def test_evaluate_stores_trajectories_rows_and_summary(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'e.db'}")
    run = store.create_run("eval-run")
    env = EchoToolEnv()
    tasks = env.tasks("val", 4)  # apple, river, stone, cloud
    assets = AgentAssets(harness=tiny_harness(workflow={"max_turns": 3},
                                              decoding={"temperature": 0.0, "max_new_tokens": 40}),
                         rubric=RUBRIC)
    res = evaluate(store, env, assets, ScriptedBackend(echo_script, tiny_tokenizer()),
                   tasks=tasks, split="val", samples=2, seed=5, run=run.id)
    assert res.mean == pytest.approx(2 / 3) and res.n_infra_failures == 2
    assert res.n_tasks == 4 and res.n_tasks_missing == 1 and res.n_scored == 6
    assert res.criteria == {"called": 1.0} and res.mean_turns == 2.0
    assert res.harness == assets.harness.hash and res.rubric == RUBRIC.hash
    ev = store.get_evaluation(res.evaluation)
    assert ev.n == 8 and ev.split == "val" and ev.run == run.id and ev.harness == res.harness
    assert ev.summary["mean"] == pytest.approx(res.mean)
    rows = {(r.task_id, r.sample): r for r in ev.results}
    assert rows[("val-cloud", 0)].status == "infra_error" and rows[("val-cloud", 0)].outcome is None
    assert rows[("val-stone", 1)].outcome == 0.0 and rows[("val-apple", 0)].outcome == 1.0
    stored = store.trajectories(evaluation=res.evaluation)
    assert sorted(t.id for t in stored) == sorted(r.trajectory for r in ev.results)
    assert all(t.split == "val" and t.harness == res.harness for t in stored)
    # the stored tokens are what the policy produced (scripted: text + EOS), masks intact
    apple = next(t for t in stored if t.task_id == "val-apple")
    assert sum(apple.loss_mask) == sum(t.end - t.start for t in apple.turns)


def test_evaluate_a_checkpoint_loads_its_adapter_and_checks_its_file(tmp_path):
    from coevo.rl import TrainConfig, Trainer, save_checkpoint

    model_dir = save_tiny_model(tmp_path / "tiny")
    model, _ = load_tiny_model(model_dir)
    trainer = Trainer(model, TrainConfig(lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]}))
    with torch.no_grad():  # a non-zero adapter, so the checkpoint really changes the policy
        for n, p in trainer.named_trainable_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 2.0)
    info = save_checkpoint(trainer, tmp_path / "ckpt")
    store = Store.open(f"sqlite:///{tmp_path / 'e.db'}")
    rec = store.add_checkpoint(path=info.path, sha256=info.sha256, base_model="tiny", step=0)

    env = FirstCharEnv()
    assets = AgentAssets(harness=tiny_harness(decoding={"temperature": 0.0, "max_new_tokens": 6}))
    backend = HFBackend.from_pretrained(model_dir, device="cpu")
    base = evaluate(store, env, assets, backend, split="val", n=3)
    tuned = evaluate(store, env, assets, backend, split="val", n=3, checkpoint=rec.id)
    assert backend.adapter == info.path and tuned.checkpoint == rec.id and base.checkpoint is None
    a = store.trajectories(evaluation=base.evaluation)
    b = store.trajectories(evaluation=tuned.evaluation)
    assert all(t.checkpoint == rec.id for t in b)
    assert [t.token_ids for t in a] != [t.token_ids for t in b]  # the adapter was applied

    (tmp_path / "ckpt" / "adapter_model.safetensors").write_bytes(b"tampered")
    with pytest.raises(CoevoError, match="differs from the stored"):
        evaluate(store, env, assets, backend, split="val", n=3, checkpoint=rec.id)


def test_evaluate_rejects_bad_arguments(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'e.db'}")
    assets = AgentAssets(harness=tiny_harness())
    with pytest.raises(CoevoError, match="split: 'dev'"):
        evaluate(store, FirstCharEnv(), assets, ScriptedBackend([]), split="dev")
    with pytest.raises(CoevoError, match="give a backend or an executor"):
        evaluate(store, FirstCharEnv(), assets)
    with pytest.raises(CoevoError, match="no val tasks"):
        evaluate(store, FirstCharEnv(size=0), assets, ScriptedBackend([]))
