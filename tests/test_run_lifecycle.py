"""A run's life outside the happy path: what is checked before the run exists (an env split
with no tasks, an unwritable checkpoint folder), a run that dies of an error (marked failed
with the error, lease released, then resumable), and where its files go (beside the store,
by run id, whatever its name). The tiny loop of tests/test_loop.py."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import sqlalchemy as sa
import tiny_glue
from rich.console import Console
from test_loop import build, config

from coevo.audit import run_view
from coevo.errors import CoevoError
from coevo.loop import run_coevolution
from coevo.store import tables as T


def _count(store, table) -> int:
    with store.transaction() as s:
        return s.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


class NoValEnv(tiny_glue.FirstCharEnv):
    def tasks(self, split="train", n=None):
        return [] if split == "val" else super().tasks(split, n)


def test_an_env_without_val_tasks_is_refused_before_the_run_exists(tmp_path):
    cfg = config(tmp_path, "gated")
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'l.db'}")
    parts.env = NoValEnv(size=12)
    with pytest.raises(CoevoError, match=r"^env test:first-char: the val split has no tasks"):
        run_coevolution(cfg, store, parts)
    assert (_count(store, T.Run), _count(store, T.Round), _count(store, T.Trajectory)) == (0, 0, 0)


def test_an_unwritable_checkpoint_dir_is_refused_before_the_run_exists(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = config(tmp_path, "gated", rl={"stage": {"steps": 1, "tasks_per_step": 2, "samples": 2,
                                                 "checkpoint_dir": str(blocker / "ckpt")}})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(CoevoError, match=r"^rl.stage.checkpoint_dir: .*/file/ckpt is not a "
                                         "writable folder"):
        run_coevolution(cfg, store, parts)
    assert _count(store, T.Run) == 0


class FailingOnce:
    """A proposer whose first call raises (a crash in the middle of a round, after the RL
    stage stored its checkpoint and rollouts); later calls propose nothing."""

    name = "failing-once"

    def __init__(self):
        self.calls = 0

    def propose(self, ctx):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("proposer backend went away")
        return []


def test_a_run_that_dies_is_failed_with_its_error_and_resumes_to_done(tmp_path):
    cfg = config(tmp_path, "gated", name="dies")
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'l.db'}")
    parts.proposers = [FailingOnce()]
    with pytest.raises(RuntimeError, match="went away"):
        run_coevolution(cfg, store, parts)
    rec = store.get_run("dies")
    assert (rec.status, rec.error) == ("failed", "RuntimeError: proposer backend went away")
    assert store.lease_holder("dies") is None
    assert [r.status for r in store.rounds("dies")] == ["running"]
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(run_view(store, "dies"))  # what `coevo runs show dies` prints
    assert "status failed  error: RuntimeError: proposer backend went away" in console.export_text()
    # A new run of the same name is refused, naming the failure and the way on.
    with pytest.raises(CoevoError, match=r"already exists \(it failed: RuntimeError: proposer "
                                         r"backend went away\); continue it with --resume dies"):
        run_coevolution(cfg, store, parts)
    n_ckpt = _count(store, T.Checkpoint)
    res = run_coevolution(cfg, store, parts, resume="dies")
    rec = store.get_run("dies")
    assert (rec.status, rec.error) == ("done", None)
    assert [r.status for r in store.rounds("dies")] == ["done"] and res.final is not None
    assert _count(store, T.Checkpoint) == n_ckpt  # the RL stage was not redone


def test_checkpoints_go_beside_the_store_by_run_id_whatever_the_name(tmp_path):
    home = Path(os.environ["HOME"])
    with pytest.raises(Exception, match="path separator"):  # a name is never a path
        config(tmp_path, "weight-only", name="../../escape")
    cfg = config(tmp_path, "weight-only", name="..escape",
                 rl={"stage": {"steps": 1, "tasks_per_step": 2, "samples": 2}})
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'proj' / 'my.db'}")
    res = run_coevolution(cfg, store, parts)
    ckpt = store.latest_checkpoint(res.run)
    want = tmp_path / "proj" / "my.artifacts" / res.run / "checkpoints"
    assert Path(ckpt.path).parent == want and Path(ckpt.path).is_dir()
    assert not (tmp_path / "escape").exists() and not (home.parent / "escape").exists()
    assert not (Path(os.environ["COEVO_HOME"]) / "runs").exists()
