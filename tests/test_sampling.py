"""Task samplers (coevo/rl/sampling.py): the capability-aware sampler reads earlier rounds' train
pass rates from a real store and draws tasks with intermediate pass rates far more often;
draws are a pure function of (construction, step), so reconstruction (what a resume does)
draws the same tasks; and on a stage whose task families have known pass rates it gives GRPO
a larger share of groups with signal than the uniform ablation."""

from __future__ import annotations

import doctest
import hashlib
from collections import Counter

import pytest
import tiny_glue
import torch

from coevo.envs.base import Response, Score, Task
from coevo.errors import CoevoError
from coevo.rl import sampling
from coevo.rl.sampling import CapabilitySampler, UniformSampler, build_sampler
from coevo.rl.stage import SAMPLERS, StageConfig, rl_stage
from coevo.store import Store
from coevo.trajectory import Trajectory

torch.set_num_threads(1)

FAMILIES = ("solved", "failed", "coin")


def pool(per_family: int = 8) -> list[Task]:
    return [Task(id=f"{f}-{i}", env="test:families", family=f,
                 messages=[{"role": "user", "content": f"Say something about {f} {i}."}])
            for f in FAMILIES for i in range(per_family)]


def traj(task: str, success: bool, i: int, criteria: dict | None = None, **kw) -> Trajectory:
    return Trajectory(env="test:families", task_id=task, split=kw.pop("split", "train"),
                      sample_index=i, outcome=float(success), success=success,
                      reward=float(success), criteria=criteria or {}, **kw)


def history_store(tmp_path, seen: int = 6, samples: int = 4) -> Store:
    """Round 0 of run "r": tasks 0..seen-1 of each family rolled out `samples` times; family
    "solved" always passes, "failed" never, "coin" on half the samples. Round 1 is open."""
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.create_run("r")
    store.start_round("r", 0)
    rows = []
    for f in FAMILIES:
        for t in range(seen):
            for i in range(samples):
                ok = {"solved": True, "failed": False, "coin": i % 2 == 0}[f]
                rows.append(traj(f"{f}-{t}", ok, i))
    store.add_trajectories(rows, run="r", round=0)
    # Validation rollouts are not evidence for the train sampler (and must never be read).
    store.add_trajectories([traj(f"failed-{t}", True, 0, split="val") for t in range(seen)],
                           run="r", round=0)
    store.start_round("r", 1)
    return store


def family_shares(sampler, steps: int = 400, k: int = 3) -> dict[str, float]:
    counts = Counter(t.family for s in range(steps) for t in sampler.sample(s, k))
    total = sum(counts.values())
    return {f: counts[f] / total for f in FAMILIES}


def test_intermediate_family_is_drawn_far_more_often(tmp_path):
    store = history_store(tmp_path)
    cap = CapabilitySampler(pool(), seed=0, store=store, run="r", round=1, samples=4)
    shares = family_shares(cap)
    assert shares["coin"] > 0.75, shares
    assert shares["solved"] < 0.15 and shares["failed"] < 0.15, shares
    uni = family_shares(UniformSampler(pool(), seed=0))
    assert abs(uni["coin"] - 1 / 3) < 0.06, uni  # the ablation does not prefer anything

    w = cap.weights()
    assert len(w) == 24 and min(w.values()) >= cap.options.min_weight
    # seen tasks: the coin family's weight is near P(signal | Beta(3, 3), G=4) ~ 0.76
    assert w["coin-0"] == pytest.approx(1 - 2 * (3 * 4 * 5 * 6) / (6 * 7 * 8 * 9), abs=0.02)
    assert w["solved-0"] == w["failed-0"] == cap.options.min_weight  # floored, not zero
    # unseen tasks (6, 7) back off to their family's rate
    assert w["coin-7"] > 0.5 > 0.1 > w["solved-7"] and w["failed-7"] < 0.1
    audit = cap.audit()
    assert audit["trajectories_read"] == 72  # train only: the 6 val rows are not read
    assert audit["families"]["coin"] == {"n": 24, "pass_rate": 0.5}
    assert audit["families"]["failed"]["pass_rate"] == 0.0


def test_draws_are_a_pure_function_of_construction_and_step(tmp_path):
    store = history_store(tmp_path)
    a = CapabilitySampler(pool(), seed=5, store=store, run="r", round=1, samples=4)
    draws = [[t.id for t in a.sample(s, 4)] for s in range(20)]
    assert all(len(set(d)) == 4 for d in draws)  # distinct within a step
    assert [[t.id for t in a.sample(s, 4)] for s in (3, 1)] == [draws[3], draws[1]]  # no state
    assert len({tuple(d) for d in draws}) > 15
    # A resumed stage rebuilds its sampler after some of this round's rollouts were stored:
    # the current round is not evidence, so the draws are the same.
    store.add_trajectories([traj(f"coin-{t}", True, i) for t in range(6) for i in range(4)],
                           run="r", round=1)
    b = CapabilitySampler(pool(), seed=5, store=store, run="r", round=1, samples=4)
    assert b.weights() == a.weights()
    assert [[t.id for t in b.sample(s, 4)] for s in range(20)] == draws
    c = CapabilitySampler(pool(), seed=6, store=store, run="r", round=1, samples=4)
    assert [[t.id for t in c.sample(s, 4)] for s in range(20)] != draws
    # the next round does read round 1: coin is now mostly solved, so it loses weight
    store.start_round("r", 2)
    d = CapabilitySampler(pool(), seed=5, store=store, run="r", round=2, samples=4)
    assert d.weights()["coin-0"] < a.weights()["coin-0"] - 0.2
    with pytest.raises(CoevoError, match="tasks_per_step: 25"):
        a.sample(0, 25)


def test_rubric_criteria_with_intermediate_pass_rates_add_weight(tmp_path):
    """Two never-solved families: one whose `format` criterion passes half the time (GRPO on a
    partial-credit reward still has signal there) outweighs one that fails it too."""
    store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
    store.create_run("r")
    store.start_round("r", 0)
    tasks = [Task(id=f"{f}-{i}", env="e", family=f, messages=[{"role": "user", "content": "x"}])
             for f in ("partial", "hopeless") for i in range(4)]
    store.add_trajectories(
        [traj(f"partial-{t}", False, i, {"format": float(i % 2)}) for t in range(4) for i in range(4)]
        + [traj(f"hopeless-{t}", False, i, {"format": 0.0}) for t in range(4) for i in range(4)],
        run="r", round=0)
    store.start_round("r", 1)
    cap = CapabilitySampler(tasks, store=store, run="r", round=1, samples=4)
    w = cap.weights()
    assert w["partial-0"] > 3 * w["hopeless-0"]
    assert cap.audit()["criteria_pass_rates"] == {"format": 0.25}
    off = CapabilitySampler(tasks, store=store, run="r", round=1, samples=4, criteria_weight=0)
    assert off.weights()["partial-0"] == off.weights()["hopeless-0"]


def test_no_history_is_close_to_uniform_and_options_are_checked(tmp_path):
    fresh = CapabilitySampler(pool(), seed=0)  # no store: every task gets the prior weight
    assert len(set(fresh.weights().values())) == 1
    with pytest.raises(CoevoError, match=r"rl\.stage\.sampler_options\.min_weight"):
        build_sampler("capability", pool(), 0, options={"min_weight": 0})
    with pytest.raises(CoevoError, match=r"rl\.stage\.sampler_options\.bogus"):
        build_sampler("capability", pool(), 0, options={"bogus": 1})
    with pytest.raises(CoevoError, match="sampler 'uniform' does not take"):
        build_sampler("uniform", pool(), 0, options={"rounds": 2})
    with pytest.raises(CoevoError, match="known: capability, uniform"):
        build_sampler("aris", pool(), 0)
    assert StageConfig().sampler == "uniform" and StageConfig().sampler_options == {}
    with pytest.raises(ValueError, match="sampler_option"):
        StageConfig(sampler_option={})  # extra="forbid": a typo is an error
    assert SAMPLERS.get("capability") is CapabilitySampler  # re-exported by stage.py


def test_doctests():
    assert doctest.testmod(sampling).failed == 0


# --- stage level ----------------------------------------------------------------------------------


class FamiliesEnv(tiny_glue.SingleTurnEnv):
    """Single-turn; the verifier depends only on the family: "solved" always passes, "failed"
    never, "coin" passes when the reply's sha256 is even (half the samples of a random policy)."""

    name = "test:families"

    def tasks(self, split: str = "train", n: int | None = None) -> list[Task]:
        out = pool(8)
        return out[:n] if n is not None else out

    def score(self, task: Task, state, response: Response) -> Score:
        if task.family == "coin":
            ok = hashlib.sha256(response.text.encode()).digest()[0] % 2 == 0
        else:
            ok = task.family == "solved"
        return Score(outcome=float(ok), success=ok)


def test_capability_sampling_gives_grpo_more_signal_than_uniform(tmp_path):
    from coevo.executors import AgentAssets
    from coevo.rl import TrainConfig, Trainer
    from tiny_glue import load_tiny_model, save_tiny_model, tiny_harness

    tiny = save_tiny_model(tmp_path / "tiny")
    assets = AgentAssets(harness=tiny_harness(decoding={"temperature": 1.0, "max_new_tokens": 4}))
    store = Store.open(f"sqlite:///{tmp_path / 'stage.db'}")
    env = FamiliesEnv()
    means = {}
    for name in ("uniform", "capability"):
        model, tok = load_tiny_model(tiny)
        trainer = Trainer(model, TrainConfig(seed=0, lr=1e-3, lora={
            "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}), base_model="tiny")
        store.create_run(name)
        store.start_round(name, 0)  # round 0: uniform in both runs (the same history)
        rl_stage(store, name, 0, env, assets, trainer,
                 StageConfig(steps=3, tasks_per_step=4, samples=4, seed=0, checkpoint_every=3,
                             checkpoint_dir=str(tmp_path / name / "0")), tokenizer=tok)
        store.start_round(name, 1)
        cfg = StageConfig(steps=4, tasks_per_step=4, samples=4, seed=1, checkpoint_every=4,
                          sampler=name, checkpoint_dir=str(tmp_path / name / "1"))
        res = rl_stage(store, name, 1, env, assets, trainer, cfg, tokenizer=tok)
        means[name] = sum(s.signal_fraction for s in res.steps) / len(res.steps)
        summary = store.get_round(name, 1).summary["sampler"]
        assert summary["name"] == name
        if name == "capability":
            assert summary["trajectories_read"] == 3 * 4 * 4  # round 0's rollouts only
            drawn = [t.task_id for t in store.trajectories(run=name, round=1)][::4]
            assert sum(t.startswith("coin") for t in drawn) >= 12, drawn  # of 16
            # what a resume rebuilds after the stage stored its rollouts draws the same tasks
            again = build_sampler("capability", env.tasks("train"), 1, store=store,
                                  run=store.get_run(name).id, round=1, samples=4)
            steps = range(res.start_step, res.end_step)
            assert [t.id for s in steps for t in again.sample(s, 4)] == drawn
    # uniform: ~1/3 of groups are coin groups, each mixed with P ~ 0.875; capability: most
    assert means["capability"] > means["uniform"] + 0.25, means
