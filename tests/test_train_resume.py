"""`coevo train --resume` continues the run that was started: the stored settings and the exact
asset versions (by hash) are restored, a flag that differs from them is refused with one line
naming each flag and leaves the store as it was, and a loop run is not resumed as a train run."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

import coevo.rl.stage as stage_mod
from coevo.cli import app
from coevo.store import Store
from tiny_glue import save_tiny_model, tiny_harness

torch.set_num_threads(1)
runner = CliRunner()
ENV = "tiny_glue:FirstCharEnv"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def spy(monkeypatch):
    """Records what each RL stage ran with, then runs the real stage."""
    seen: list[dict] = []
    real = stage_mod.rl_stage

    def recording(store, run, round, env, assets, trainer, cfg, **kw):
        seen.append({"cfg": cfg, "train": trainer.config, "harness": assets.harness.hash,
                     "env": getattr(env, "name", env)})
        return real(store, run, round, env, assets, trainer, cfg, **kw)

    monkeypatch.setattr(stage_mod, "rl_stage", recording)
    return seen


def _rows(store: Store, run: str) -> tuple:
    latest = store.latest_checkpoint(run)
    return (len(store.trajectories(run)), latest and (latest.id, latest.step),
            store.budget_totals(run), store.get_run(run).config)


def _train(db: str, *flags: str):
    return runner.invoke(app, ["train", *flags, "--db", db])


def test_resume_restores_the_stored_settings_and_asset_versions(tiny_dir, tmp_path, spy,
                                                                 monkeypatch):
    monkeypatch.setenv("COEVO_HOME", str(tmp_path / "home"))
    db = f"sqlite:///{tmp_path / 't.db'}"
    store = Store.open(db)
    first = tiny_harness()
    store.put_asset(first)
    flags = ["--harness", "tiny", "--env", ENV, "--model", f"hf:{tiny_dir}", "--run", "t",
             "--steps", "2", "--group-size", "2", "--tasks-per-step", "2", "--lr", "0.02",
             "--lora-rank", "4", "--checkpoint-every", "1", "--seed", "3"]
    r = _train(db, *flags)
    assert r.exit_code == 0, r.output
    stored = store.get_run("t").config
    assert stored["harness"] == first.hash and stored["lr"] == 0.02 and stored["group_size"] == 2
    # A newer version of the harness name appears after the run was started.
    newer = first.child(system_prompt="Reply in one word.")
    store.put_asset(newer)
    assert store.get_asset("harness", "tiny").hash == newer.hash
    before = _rows(store, "t")

    # Resume with only the run's name: everything comes back from the run, not the defaults
    # (G 4, lr 1e-4, rank 16, checkpoint every 5, seed 0) nor the newest harness version.
    r = _train(db, "--run", "t", "--resume")
    assert r.exit_code == 0, r.output
    got = spy[-1]
    assert (got["cfg"].steps, got["cfg"].samples, got["cfg"].tasks_per_step) == (2, 2, 2)
    assert (got["cfg"].seed, got["cfg"].checkpoint_every) == (3, 1)
    assert got["train"].lr == 0.02 and got["train"].lora.rank == 4 and got["train"].seed == 3
    assert got["harness"] == first.hash != newer.hash
    assert got["env"] == ENV
    assert _rows(store, "t") == before  # the stage was complete: nothing redone

    # A flag equal to the stored value is fine; differing flags are refused together, in one
    # line, and nothing is written.
    assert _train(db, "--run", "t", "--resume", "--lr", "0.02").exit_code == 0
    r = _train(db, "--run", "t", "--resume", "--lr", "0.5", "--group-size", "3", "--harness",
               "tiny")
    assert r.exit_code == 1
    msg = r.output.strip()
    assert "\n" not in msg and "train --resume t:" in msg
    assert "--lr 0.5 (stored: 0.02)" in msg and "--group-size 3 (stored: 2)" in msg
    assert f"--harness {newer.hash[:12]} (stored: {first.hash[:12]})" in msg
    assert "--seed" not in msg
    assert _rows(store, "t") == before
    store.close()


def test_a_loop_run_or_a_run_without_settings_is_refused(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    store = Store.open(db)
    store.create_run("loop-run", config={"env": "rg:basic_arithmetic", "rounds": 2})
    r = _train(db, "--run", "loop-run", "--resume")
    assert r.exit_code == 1
    assert "was not created by `coevo train`" in r.output
    assert "coevo run --resume loop-run" in r.output
    # Before the full settings were stored a train run kept env/model/steps/seed only.
    store.create_run("old", config={"command": "train", "env": ENV, "model": "embedded",
                                    "steps": 3, "seed": 1}, mode="weight-only")
    r = _train(db, "--run", "old", "--resume", "--steps", "5")
    assert r.exit_code == 1 and "--steps 5 (stored: 3)" in r.output
    r = _train(db, "--run", "old", "--resume")
    assert r.exit_code == 1 and "stores no harness: give --harness" in r.output
    r = _train(db, "--env", ENV)
    assert r.exit_code == 1 and "give --harness and --env" in r.output
    assert [x.name for x in store.runs()] == ["loop-run", "old"]
    store.close()
