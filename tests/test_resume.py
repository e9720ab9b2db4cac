"""Crash and resume: the loop runs in a subprocess that is SIGKILLed, at a named point (after the
RL stage, after the proposals, inside the gate after an arm evaluation or a candidate's
comparison, ...) or at a random wall-clock moment, then resumed; EVERY stored row (assets, runs,
rounds with their summaries, checkpoints, trajectories, evaluations and their results,
proposals, decisions, evidence, budget charges) equals an uninterrupted run's, up to the
values that cannot repeat: generated ids (mapped to what they identify), timestamps, paths
and measured seconds."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from coevo.store import Store
from coevo.store.tables import Base

TESTS = Path(__file__).resolve().parent

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import test_loop
from coevo.errors import NotFound
from coevo.loop import run_coevolution
tmp, url = sys.argv[1], sys.argv[2]
cfg = test_loop.config(tmp, "gated", rounds=2, name="crash")
store, parts = test_loop.build(tmp, cfg, url)
try:
    store.get_run("crash")
except NotFound:  # killed before the run was created: start it (what a user would do)
    resume = None
else:
    resume = "crash"
run_coevolution(cfg, store, parts, resume=resume)
"""


def _cmd(tmp: Path, url: str) -> list[str]:
    return [sys.executable, "-c", SCRIPT.format(tests=str(TESTS)), str(tmp), url]


def _env(kill_at: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COEVO_TEST_KILL_AT", None)
    if kill_at:
        env["COEVO_TEST_KILL_AT"] = kill_at
    return env


def _run(tmp: Path, url: str, kill_at: str | None = None) -> int:
    done = subprocess.run(_cmd(tmp, url), env=_env(kill_at), capture_output=True, timeout=600)
    assert done.returncode in (0, -9), done.stderr.decode()[-3000:]
    return done.returncode


# --- the snapshot: every table, ids mapped to what they identify ----------------------------

VOLATILE = {"created_at", "updated_at", "started_at", "ended_at", "seq", "timings", "path",
            "sha256", "seconds", "seconds_rollout", "seconds_train", "rollout_tokens_per_s",
            "train_tokens_per_s", "tokens_per_s", "group_id"}  # group_id: a hash of ids
_HEX = re.compile(r"[0-9a-f]{32}(?:[0-9a-f]{32})?")


def _rows(conn: sa.Connection, table: str) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(sa.select(Base.metadata.tables[table]))]


def snapshot(url: str, tmp: Path) -> dict[str, list[str]]:
    """Every table's rows as sorted canonical JSON; generated ids and keys replaced by labels
    made of what the row is (round, step, split, arm assets, tasks and seeds, ...)."""
    store = Store.open(url)
    with store.engine.connect() as conn:
        t = {name: _rows(conn, name) for name in Base.metadata.tables}
    store.close()
    label: dict[str, str] = {}
    for r in t["runs"]:
        label[r["id"]] = f"run:{r['name']}"
    for c in t["checkpoints"]:
        label[c["id"]] = f"ckpt:{c['round']}:{c['step']}"
    trajs_of: dict[str, list[tuple]] = {}
    for x in t["trajectories"]:
        trajs_of.setdefault(x["evaluation_id"], []).append((x["task_id"], x["sample_index"], x["seed"]))
    for e in t["evaluations"]:
        name = json.dumps([e["round"], e["split"], e["harness_hash"], e["skill_library_hash"],
                           e["rubric_hash"], label.get(e["checkpoint_id"]),
                           sorted(trajs_of.get(e["id"], []))])
        label[e["id"]] = f"eval:{name}"
        if e["key"]:
            label[e["key"]] = f"key:{name}"
    for x in t["trajectories"]:
        label[x["id"]] = f"traj:{label.get(x['evaluation_id'], 'rl')}:{x['round']}:{x['task_id']}:{x['sample_index']}:{x['seed']}"
    for p in t["proposals"]:
        label[p["id"]] = f"prop:{p['round']}:{p['proposer']}:{p['rationale']}:{p['candidate_hash']}"
    for d in t["decisions"]:
        label[d["id"]] = f"dec:{label[d['proposal_id']]}"

    def canon(v: Any) -> Any:
        if isinstance(v, dict):
            return {canon(k): canon(x) for k, x in v.items() if k not in VOLATILE}
        if isinstance(v, list):
            return [canon(x) for x in v]
        if isinstance(v, bytes):
            return v.hex()
        if isinstance(v, str):
            v = v.replace(str(tmp), "TMP")
            return _HEX.sub(lambda m: label.get(m.group(0), m.group(0)), v)
        return v

    out = {}
    for name, rows in t.items():
        keep = []
        for r in rows:
            r = {k: v for k, v in r.items() if k not in {"id"} | VOLATILE or name == "asset_versions"
                 and k == "id"}
            if name == "budgets" and r["kind"] == "seconds":
                continue  # measured, not charged the same twice
            keep.append(json.dumps(canon(r), sort_keys=True, default=str))
        out[name] = sorted(keep)
    return out


def decisions(url: str) -> list[tuple]:
    store = Store.open(url)
    run = store.get_run("crash")
    out = sorted((p.round, p.rationale, p.status, d.accepted, d.policy, d.reason)
                 for p in store.proposals(run=run.id) for d in store.decisions(p.id))
    store.close()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    url = f"sqlite:///{tmp / 'ref.db'}"
    t0 = time.perf_counter()
    assert _run(tmp, url) == 0
    return snapshot(url, tmp), decisions(url), time.perf_counter() - t0


def _check(reference, url: str, tmp: Path) -> None:
    want, want_decisions, _ = reference
    got = snapshot(url, tmp)
    for table in want:
        assert got[table] == want[table], f"table {table} differs after the crash and resume"
    assert decisions(url) == want_decisions
    assert any(d[2] == "accepted" for d in want_decisions)  # the helpful candidate survived
    assert len(want["decisions"]) == len(want["proposals"]) - sum(
        '"status": "invalid"' in p for p in want["proposals"])  # one decision per gated proposal


# Named points: between the stages, and inside the gate (after the incumbent arm's evaluation,
# after the first candidate's comparison, after the round's last arm evaluation).
@pytest.mark.parametrize("point", ["after_rl:0", "after_proposals:0", "gate_eval:0:0",
                                   "gate_candidate:0:0", "gate_eval:0:2", "after_decisions:1",
                                   "before_final"])
def test_kill_at_a_named_point_then_resume_equals_uninterrupted(reference, tmp_path, point):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert _run(tmp_path, url, kill_at=point) == -9  # really killed there
    assert _run(tmp_path, url) == 0
    _check(reference, url, tmp_path)


@pytest.mark.slow  # ~10 crash + resume pairs of the whole run
def test_kill_at_random_moments_then_resume_equals_uninterrupted(reference, tmp_path):
    """Ten SIGKILLs at seeded random wall-clock moments of the run (anywhere: inside the RL
    stage, a checkpoint write, an evaluation, a store transaction)."""
    wall = reference[2]
    moments = sorted(random.Random(14).uniform(0.5, wall) for _ in range(10))
    killed = 0
    for k, moment in enumerate(moments):
        tmp = tmp_path / f"k{k}"
        tmp.mkdir()
        url = f"sqlite:///{tmp / 'c.db'}"
        proc = subprocess.Popen(_cmd(tmp, url), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=moment)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed += 1
        assert _run(tmp, url) == 0
        _check(reference, url, tmp)
    assert killed >= 8  # most moments fell inside the run, not after it
