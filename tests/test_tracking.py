"""Experiment tracking: a scripted co-evolution run (tests/test_loop.py's tiny Llama and scripted
policy) logged to a REAL local MLflow store (sqlite:) and a REAL local trackio project, read
back with each library's own reading API and compared with coevo's store; a resume continues
the same tracker run; a tracker failure is one line and the run goes on; a missing package is
one line before anything runs; `coevo train --track` and `coevo eval --track`."""

from __future__ import annotations

import doctest
import json
import os
import sys
from importlib.util import find_spec

import pytest
from typer.testing import CliRunner

from coevo.cli import app
from coevo.config import RunConfig
from coevo.errors import AssetError, CoevoError
from coevo.loop import run_coevolution
from coevo.store import Store
from coevo.tracking import TrackingSpec
from test_loop import HELPS, NO_EFFECT, build, config

runner = CliRunner()


@pytest.fixture(autouse=True)
def trackers(tmp_path, monkeypatch):
    """Both packages (the dev extra installs them: in CI their absence is an error, not a
    skip), and a working folder of the test's own: MLflow's default artifact folder is
    ./mlruns. trackio is imported by the tests only after a run chose its folder: it reads
    the folder once, at import."""
    missing = [p for p in ("mlflow", "trackio") if find_spec(p) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install {', '.join(missing)} (pip install -e '.[dev]')")
        pytest.skip(f"needs coevo[mlflow,trackio] ({', '.join(missing)} missing)")
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def trackio_dir(tmp_path_factory):
    """trackio reads its folder once per process (at import): one folder for this module,
    a project per test."""
    return tmp_path_factory.mktemp("trackio")


def _run(tmp_path, tracking: dict, rounds: int, resume: str | None = None, lines=None):
    cfg = config(tmp_path, rounds=rounds, name="tracked", tracking=tracking)
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    res = run_coevolution(cfg, store, parts, resume=resume,
                          progress=(lines.append if lines is not None else None))
    return store, res


def _expected(store: Store, run: str) -> dict:
    """What the tracker must hold, read from coevo's store."""
    rounds = store.rounds(run)
    props = store.proposals(run)
    return {
        "val": [(x.index, x.summary["val_score"]) for x in rounds],
        "val_start": rounds[0].summary["val_start_score"],
        "rl_steps": sorted(e["step"] for x in rounds for e in x.summary.get("rl_steps", [])),
        "rewards": {e["step"]: e["reward_mean"] for x in rounds for e in x.summary["rl_steps"]},
        "decided": sorted(p.id for p in props if store.decisions(p.id)),
        "accepted": [sum(p.status == "accepted" for p in props if p.round == x.index) for x in rounds],
        "test": rounds[-1].summary["test_score"],
    }


def test_doctests():
    import coevo.tracking.base

    assert doctest.testmod(coevo.tracking.base).failed == 0


def test_spec_from_flag_and_config_names_the_bad_field():
    assert TrackingSpec.parse("mlflow:sqlite:///a/b.db").uri == "sqlite:///a/b.db"
    assert TrackingSpec.parse("trackio:arith").project == "arith"
    assert TrackingSpec.parse("trackio").project == "coevo" and TrackingSpec.parse("off") is None
    with pytest.raises(ValueError, match="unknown tracking backend 'wandb'; known: mlflow, trackio"):
        TrackingSpec.parse("wandb")
    base = {"name": "x", "env": "rg:basic_arithmetic", "assets": {"harness": "h"}}
    with pytest.raises(AssetError, match=r"tracking\.uri: .*not a setting of the trackio backend \(it takes dir\)"):
        RunConfig.from_mapping({**base, "tracking": {"backend": "trackio", "uri": "sqlite:///x.db"}})
    with pytest.raises(AssetError, match=r"tracking\.projet: unknown key"):
        RunConfig.from_mapping({**base, "tracking": {"backend": "mlflow", "projet": "x"}})
    cfg = RunConfig.load(data=base, overrides=["tracking.backend=mlflow", "tracking.uri=sqlite:///m.db"])
    assert (cfg.tracking.backend, cfg.tracking.uri) == ("mlflow", "sqlite:///m.db")


def test_mlflow_store_holds_the_run_and_a_resume_continues_it(tmp_path):
    from mlflow import MlflowClient
    from mlflow.artifacts import load_dict

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = {"backend": "mlflow", "uri": uri, "project": "coevo-test"}
    store, first = _run(tmp_path, tracking, rounds=1)
    link = store.get_run(first.run).config["trackers"]
    first_test = store.get_round(first.run, 0).summary["final_evaluation"]
    assert len(link) == 1 and (link[0]["rounds"], link[0]["final"]) == (1, first_test)
    mid = link[0]["run_id"]
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(mid).info.status == "FINISHED"

    # Resume with one more round: the same MLflow run goes on, nothing is logged twice.
    store, res = _run(tmp_path, tracking, rounds=2, resume="tracked")
    assert store.get_run(res.run).config["trackers"][0]["run_id"] == mid
    exp = client.get_experiment_by_name("coevo-test")
    assert [r.info.run_id for r in client.search_runs([exp.experiment_id])] == [mid]
    want = _expected(store, res.run)
    run = client.get_run(mid)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.tags["coevo.run_id"] == res.run and run.data.tags["coevo.mode"] == "gated"
    assert run.data.params["rounds"] == "1"  # params are the run as created; MLflow never edits them
    assert run.data.params["gate.screen_size"] == "12" and "tracking.backend" not in run.data.params
    assert run.data.params["seed.harness"] == store.get_run(res.run).config["seed"]["harness"]

    def history(key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(mid, key),
                                                  key=lambda m: m.step)]

    assert history("val/score") == want["val"] and len(want["val"]) == 2
    assert history("val/score_start") == [(0, want["val_start"])]
    assert [s for s, _ in history("rl/reward_mean")] == want["rl_steps"] == [1, 2]
    assert dict(history("rl/reward_mean")) == want["rewards"]
    assert [v for _, v in history("gate/accepted")] == want["accepted"] == [1, 0]
    # The run extended by the resume is tested anew: both finals, at their last rounds.
    assert history("test/score") == [(0, first.final.mean), (1, want["test"])] == [(0, 1.0), (1, 1.0)]
    assert all(v > 0 for _, v in history("propose/seconds"))
    tables = [a.path for a in client.list_artifacts(mid, "gate/decisions")]
    assert tables == ["gate/decisions/0.json"]  # round 1 proposed nothing: no table
    rows = [r for p in tables for r in load_dict(f"{run.info.artifact_uri}/{p}")]
    assert sorted(r["proposal"] for r in rows if r["policy"]) == want["decided"]
    helps = next(r for r in rows if r["accepted"])
    assert helps["round"] == 0 and helps["policy"] == "paired" and helps["p_adjusted"] < 0.05


def test_trackio_project_holds_the_run_and_a_resume_continues_it(tmp_path, trackio_dir):
    tracking = {"backend": "trackio", "project": "coevo-loop", "dir": str(trackio_dir)}
    store, first = _run(tmp_path, tracking, rounds=1)
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    tid = store.get_run(first.run).config["trackers"][0]["run_id"]
    store, res = _run(tmp_path, tracking, rounds=2, resume="tracked")
    link = store.get_run(res.run).config["trackers"]
    assert [x["run_id"] for x in link] == [tid] and link[0]["location"] == str(trackio_dir)
    assert [(r.name, r.id) for r in trackio.Api().runs("coevo-loop")] == [("tracked", tid)]
    config = SQLiteStorage.get_run_config("coevo-loop", "tracked", run_id=tid)
    assert config["coevo.run_id"] == res.run and config["gate.screen_size"] == 12

    want = _expected(store, res.run)
    logs = SQLiteStorage.get_logs("coevo-loop", "tracked", run_id=tid)

    def series(key):
        return sorted((x["step"], x[key]) for x in logs if key in x)

    assert series("val/score") == want["val"]
    assert series("val/score_start") == [(0, want["val_start"])]
    assert [s for s, _ in series("rl/reward_mean")] == want["rl_steps"]
    assert dict(series("rl/reward_mean")) == want["rewards"]
    assert [v for _, v in series("gate/accepted")] == want["accepted"]
    assert series("test/score") == [(0, first.final.mean), (1, want["test"])]
    tables = [x["gate/decisions"]["_value"] for x in logs if "gate/decisions" in x]
    rows = [r for t in tables for r in t]
    assert sorted(r["proposal"] for r in rows if r["policy"]) == want["decided"]


def test_a_tracker_failure_is_one_line_and_a_later_tracker_catches_up(tmp_path):
    from mlflow import MlflowClient

    lines: list[str] = []
    (tmp_path / "a-file").write_text("in the way")  # MLflow cannot create its store below it
    broken = {"backend": "mlflow", "uri": f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"}
    store, res = _run(tmp_path, broken, rounds=1, lines=lines)
    said = [x for x in lines if x.startswith("tracking:")]
    assert len(said) == 1 and "the run goes on without tracking" in said[0] and "\n" not in said[0]
    assert store.get_run(res.run).status == "done" and res.final.mean == 1.0
    assert "trackers" not in store.get_run(res.run).config

    # Resumed with a tracker that works: the new tracker run first gets the stored history.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store, res = _run(tmp_path, {"backend": "mlflow", "uri": uri}, rounds=2, resume="tracked")
    want = _expected(store, res.run)
    mid = store.get_run(res.run).config["trackers"][0]["run_id"]
    client = MlflowClient(tracking_uri=uri)

    def history(key):
        return sorted((m.step, m.value) for m in client.get_metric_history(mid, key))

    assert history("val/score") == want["val"]
    assert [s for s, _ in history("rl/reward_mean")] == want["rl_steps"] == [1, 2]
    assert [s for s, _ in history("test/score")] == [0, 1]


def test_a_missing_package_is_one_line_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if mlflow-skinny were not installed
    db = f"sqlite:///{tmp_path / 'c.db'}"
    cfg = config(tmp_path, name="untracked", tracking={"backend": "mlflow"})
    with pytest.raises(CoevoError, match=r"needs the mlflow package: pip install 'coevo\[mlflow\]'"):
        run_coevolution(cfg, Store.open(db))
    assert Store.open(db).runs() == []
    r = runner.invoke(app, ["eval", "--harness", "h", "--env", "x", "--track", "mlflow", "--db", db])
    assert r.exit_code != 0
    assert "--track" in r.output and "pip install 'coevo[mlflow]'" in r.output


def test_train_and_eval_track_to_mlflow(tmp_path):
    from mlflow import MlflowClient

    from tiny_glue import save_tiny_model, tiny_harness

    tiny = save_tiny_model(tmp_path / "tiny")
    db, uri = f"sqlite:///{tmp_path / 't.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    Store.open(db).put_asset(tiny_harness())
    flags = ["--harness", "tiny", "--env", "tiny_glue:FirstCharEnv", "--model", f"hf:{tiny}",
             "--db", db, "--track", f"mlflow:{uri}"]
    r = runner.invoke(app, ["train", *flags, "--run", "t", "--steps", "2", "--group-size", "2",
                            "--tasks-per-step", "2", "--lora-rank", "2", "--checkpoint-every", "1"])
    assert r.exit_code == 0, r.output
    store = Store.open(db)
    link = store.get_run("t").config["trackers"][0]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(link["run_id"])
    assert run.data.params["steps"] == "2" and run.data.tags["coevo.run"] == "t"
    steps = client.get_metric_history(link["run_id"], "rl/reward_mean")
    assert sorted(m.step for m in steps) == [1, 2] and run.info.status == "FINISHED"

    r = runner.invoke(app, ["eval", *flags, "--split", "val", "--n", "3"])
    assert r.exit_code == 0, r.output
    ev = [x for x in client.search_runs([run.info.experiment_id]) if x.info.run_id != link["run_id"]]
    assert len(ev) == 1 and f"tracking: mlflow run {ev[0].info.run_id}" in " ".join(r.output.split())
    evaluation = ev[0].data.tags["coevo.evaluation"]
    stored = store.get_evaluation(evaluation).summary
    assert ev[0].data.metrics["val/score"] == stored["mean"]
    assert ev[0].data.metrics["val/n_tasks"] == 3 and json.loads(ev[0].data.params["n"]) == 3
