"""Frozen validation splits: `coevo splits freeze` writes ids + content hashes, `coevo splits
check` and the loop refuse an environment whose val / test tasks changed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import tiny_glue
from coevo.cli import app
from coevo.config import RunConfig
from coevo.envs.registry import make_env
from coevo.errors import CoevoError
from coevo.frozen_splits import check_frozen, freeze, read_frozen, write_frozen
from coevo.loop import run_coevolution
from conftest import REPO
from test_loop import build, config

runner = CliRunner()


def tasks_file(path, answers):
    path.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"{i} + 1?", "answer": a})
                              for i, a in enumerate(answers)) + "\n")
    return path


def test_freeze_then_check_refuses_an_edited_or_grown_task_file(tmp_path):
    f = tasks_file(tmp_path / "t.jsonl", [str(i + 1) for i in range(30)])
    out = tmp_path / "validation" / "t.yaml"
    r = runner.invoke(app, ["splits", "freeze", f"jsonl:{f}", "--out", str(out)])
    assert r.exit_code == 0, r.output
    frozen = read_frozen(out)
    env = make_env(f"jsonl:{f}")
    assert frozen.splits["val"].ids == [t.id for t in env.tasks("val")]
    assert set(frozen.splits) == {"val", "test"} and frozen.splits["test"].n == len(env.tasks("test"))
    assert runner.invoke(app, ["splits", "check", str(out)]).exit_code == 0

    # The same ids, one val answer changed: the content hash catches it.
    val0 = int(frozen.splits["val"].ids[0][1:])
    answers = [str(i + 1) for i in range(30)]
    answers[val0] = "wrong"
    tasks_file(f, answers)
    r = runner.invoke(app, ["splits", "check", str(out)])
    assert r.exit_code == 1 and "splits.val: the content of the val tasks changed" in r.output
    # A task file that grew: new ids land in the splits.
    tasks_file(f, [str(i + 1) for i in range(60)])
    r = runner.invoke(app, ["splits", "check", str(out)])
    assert r.exit_code == 1 and "tasks changed" in r.output and "refusing to run" in r.output


class EditedEnv(tiny_glue.FirstCharEnv):
    """FirstCharEnv with one task's prompt reworded: a benchmark changed under the same ids."""

    def tasks(self, split="train", n=None):
        out = super().tasks(split, n)
        if out:
            out[0] = out[0].model_copy(update={"messages": [{"role": "user", "content": "Reworded."}]})
        return out


def test_the_loop_refuses_to_start_on_a_changed_val_set(tmp_path):
    path = write_frozen(freeze(tiny_glue.FirstCharEnv(size=12), "test:first-char"), tmp_path / "v.yaml")
    check_frozen(path, tiny_glue.FirstCharEnv(size=12), {"val": 12, "test": None})
    cfg = config(tmp_path, "harness-only", splits={"val_n": 12, "test_n": 6, "frozen": str(path)})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    edited = dataclasses.replace(parts, env=EditedEnv(size=12))
    with pytest.raises(CoevoError, match="splits.val: the content of the val tasks changed"):
        run_coevolution(cfg, store, edited)
    assert store.runs() == []  # refused before the run was created
    run_coevolution(cfg, store, parts)  # on the frozen tasks the run goes ahead
    rows = len(store.trajectories(cfg.name))
    with pytest.raises(CoevoError, match="splits.val: the content"):  # a resume is checked too
        run_coevolution(cfg, store, edited, resume=cfg.name)
    assert len(store.trajectories(cfg.name)) == rows
    with pytest.raises(CoevoError, match="the run takes 13 val tasks, only 12 are frozen"):
        check_frozen(path, tiny_glue.FirstCharEnv(size=14), {"val": 13})


def test_shipped_configs_name_frozen_files_that_match():
    for name in ("quickstart.yaml", "bench/arithmetic.yaml", "bench/arithmetic-rl.yaml"):
        cfg = RunConfig.load(REPO / "training" / name)
        env = make_env(cfg.env)
        check_frozen(cfg.splits.frozen, env, {"val": cfg.splits.val_n, "test": cfg.splits.test_n})
    example = read_frozen(REPO / "validation" / "support-tasks.yaml")
    check_frozen(REPO / "validation" / "support-tasks.yaml", make_env(example.spec))
    assert RunConfig.load(REPO / "training" / "bench" / "bfcl.yaml").splits.frozen == \
        "validation/bfcl-simple-python.yaml"
