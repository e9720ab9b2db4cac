"""The gate's power before a run (coevo/power.py, coevo/gateplan.py, `coevo run --dry-run`)."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
import yaml
from typer.testing import CliRunner

from coevo.assets.io import load_asset
from coevo.cli import app
from coevo.config import RunConfig
from coevo.envs import make_env
from coevo.gate import Evidence, GatePolicy, PairedOutcome, decide
from coevo.gateplan import plan, size_val_split
from coevo.loop import run_coevolution
from coevo.power import discordance, mde, power, sign_power, tasks_for
from coevo.store import Store
from coevo.store import tables as T
from coevo.trajectory import Trajectory
from test_loop import HELPS, build, config

ENV = "rg:basic_arithmetic?min_terms=2&max_terms=2&size=200"


def simulated_acceptance(n: int, psi: float, alpha: float, k: int, delta: float, reps: int,
                         seed: int = 0) -> float:
    """How often the gate's own `decide` accepts synthetic paired outcomes drawn from the
    power model: per pair a win w.p. (psi + delta) / 2, a loss w.p. (psi - delta) / 2."""
    rng = np.random.default_rng(seed)
    a, b = (psi + delta) / 2, (psi - delta) / 2
    policy = GatePolicy(alpha=alpha, n_boot=1000)
    accepted = 0
    for _ in range(reps):
        u, same = rng.random((n, k)), rng.random((n, k)) < 0.5
        pairs = []
        for i in range(n):
            for s in range(k):
                inc, cand = ((0.0, 1.0) if u[i, s] < a else (1.0, 0.0) if u[i, s] < a + b
                             else (float(same[i, s]),) * 2)
                pairs.append(PairedOutcome(task_id=f"t{i}", sample=s, incumbent=inc, candidate=cand))
        accepted += decide(Evidence(pairs=pairs), policy).accepted
    return accepted / reps


def test_sign_power_matches_a_hand_computation():
    # every discordant pair a win, half the pairs discordant: pass iff D >= 5 of 10
    # (1/32 <= 0.05 < 1/16), so power = P(Bin(10, 1/2) >= 5) = 638/1024
    assert sign_power(10, 0.5, 0.0, 0.05) == pytest.approx(638 / 1024)
    assert sign_power(10, 0.0, 0.0, 0.05) == 0.0


@pytest.mark.parametrize("n,k", [(40, 1), (30, 2)])
def test_mde_is_where_the_gates_test_has_power_0_8(n, k):
    psi, alpha = 0.3, 0.05
    effect = mde(n, psi, alpha, samples=k)
    assert power(n, effect, psi, alpha, k) == pytest.approx(0.8, abs=1e-3)
    assert 0.05 < effect < psi
    rate = simulated_acceptance(n, psi, alpha, k, effect, reps=600)
    assert rate == pytest.approx(0.8, abs=0.06)  # 600 draws: 3.7 standard errors
    # well below the MDE the gate rarely accepts; more tasks detect less
    assert simulated_acceptance(n, psi, alpha, k, effect / 3, reps=200, seed=1) < 0.5
    assert mde(4 * n, psi, alpha, samples=k) < effect / 1.6


def test_discordance_within_tasks_or_pooled():
    # 4 tasks seen twice each: 2 flip (discordance 1 each), 2 stable (0) -> 0.5
    psi, how = discordance({"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0], "d": [0.0, 0.0]})
    assert psi == pytest.approx(0.5) and how.startswith("observed within-task")
    # one outcome per task: pooled 1 - (p^2 + (1-p)^2) with p = 1/4
    psi, how = discordance({"a": [1.0], "b": [0.0], "c": [0.0], "d": [0.0]})
    assert psi == pytest.approx(0.375) and "upper bound" in how
    assert discordance({}) is None


def cfg_for(**gate) -> RunConfig:
    return RunConfig.from_mapping({
        "name": "p", "env": ENV, "assets": {"harness": "reasoning", "seed_dir": "."},
        "proposers": [{"name": "demos"}, {"name": "harness", "options": {"candidates": 2}},
                      {"name": "rubrics"}],
        "gate": {"alpha": 0.05, **gate}, "splits": {"val_n": 20}})


def test_target_effect_gives_the_val_n_of_the_formula():
    env = make_env(ENV)
    split = len(env.tasks("val"))
    p = plan(cfg_for(target_effect=0.4, discordance=0.5), env)
    assert p.family == 3  # demos 1 + harness 2; rubric candidates are not in the Holm family
    n = tasks_for(0.4, 0.5, 0.05 / 3, 1, 0.8, n_max=split)
    assert p.val_n == p.needed == n and n != 20  # replaces the configured val_n
    assert power(n, 0.4, 0.5, 0.05 / 3) >= 0.8 > power(n - 1, 0.4, 0.5, 0.05 / 3)
    assert p.mde_family == pytest.approx(mde(n, 0.5, 0.05 / 3), abs=1e-3)
    # an effect the split cannot detect: capped at the split, and said so
    small = plan(cfg_for(target_effect=0.02, discordance=0.5), env)
    assert small.needed is None and small.val_n == split
    assert f"more than the {split} the val split holds" in "\n".join(small.lines())
    # without a target, val_n stays the configured one
    assert plan(cfg_for(discordance=0.5), env).val_n == 20


def test_the_loop_runs_the_gate_on_the_sized_val_split(tmp_path):
    # every pair a win (discordance 1, effect 1): the sign test passes on 6 tasks at
    # alpha 0.05 (1/64; on 5, 1/32 would do at 0.05 alone): so val_n 6, not the configured 12
    cfg = config(tmp_path, "harness-only", candidates=(HELPS,),
                 gate={"screen_size": 12, "n_boot": 200, "target_effect": 1.0, "discordance": 1.0,
                       "alpha": 0.025})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    res = run_coevolution(cfg, store, parts)
    [prop] = store.proposals(res.run)
    assert prop.status == "accepted" and len(store.decisions(prop.id)[0].evidence) == 6
    assert store.get_run(res.run).config["config"]["splits"]["val_n"] == 6
    # a resume keeps the stored val_n whatever the store now shows
    resumed = size_val_split(cfg, parts.env, store, resume=res.run)
    assert resumed.splits.val_n == 6


def row_counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    with engine.connect() as c:
        out = {t.name: c.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
               for t in T.Base.metadata.sorted_tables}
    engine.dispose()
    return out


def test_dry_run_loads_no_model_writes_nothing_and_uses_observed_outcomes(tmp_path):
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    env = make_env(ENV)
    harness = load_asset("harnesses/reasoning.yaml")
    store = Store.open(url)
    store.put_asset(harness)
    # an earlier run's val episodes of this env and harness: 12 tasks x 2 draws, 6 of them flip
    run = store.create_run("earlier", config={}, mode="gated")
    store.start_round(run.id, 0)
    trajs = [Trajectory(env=env.name, task_id=t.id, split="val", harness=harness.hash, sample_index=s,
                        outcome=float(s == 0 or i % 2 == 0), success=bool(s == 0 or i % 2 == 0))
             for i, t in enumerate(env.tasks("val")[:12]) for s in range(2)]
    store.add_trajectories(trajs, run=run.id, round=0)
    store.close()
    before, size = row_counts(url), db.stat().st_size

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "name": "dry", "env": ENV, "model": {"backend": "hf:/no/such/model"},
        "assets": {"harness": "reasoning", "seed_dir": "."}, "proposers": [{"name": "demos"}],
        "gate": {"alpha": 0.05, "target_effect": 0.5}, "splits": {"val_n": 40}}))
    out = CliRunner().invoke(app, ["run", str(cfg_file), "--dry-run", "--db", str(db)])
    assert out.exit_code == 0, out.output
    n = tasks_for(0.5, 0.5, 0.05, 1, 0.8, n_max=len(env.tasks("val")))
    assert "discordance 0.500: observed within-task variation: 12 tasks" in out.output
    assert f"-> splits.val_n {n} " in out.output
    assert f"minimum detectable effect: {mde(n, 0.5, 0.05):+.3f}" in out.output
    assert row_counts(url) == before and db.stat().st_size == size  # nothing written
    assert before["runs"] == 1 and before["trajectories"] == 24
    # no store at all: the assumed discordance, and no file is created
    missing = tmp_path / "none.db"
    out = CliRunner().invoke(app, ["run", str(cfg_file), "--dry-run", "--db", str(missing)])
    assert out.exit_code == 0 and "discordance 0.300: assumed" in out.output
    assert not missing.exists()
