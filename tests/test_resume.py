"""Crash and resume: the loop runs in a subprocess that is SIGKILLed, at a named point (after the
RL stage, after the proposals, inside the gate after an arm evaluation or a candidate's
comparison, ...) or at a random wall-clock moment, then resumed; EVERY stored row (assets, runs,
rounds with their summaries, checkpoints, trajectories, evaluations and their results,
proposals, decisions, evidence, budget charges, run leases) equals an uninterrupted run's, up
to the values that cannot repeat: generated ids (mapped to what they identify), timestamps,
paths, checkpoint file digests, measured seconds (and the `seconds` budget charges); see
VOLATILE and snapshot(). One test kills a run and then each of its resumes ten times over.

Two processes: a second process on a run that another executes is refused with the lease
error and stores nothing; two different runs in one store at once both finish (SQLite, and
PostgreSQL with COEVO_TEST_PG_URL)."""

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

from coevo.errors import NotFound
from coevo.store import Store
from coevo.store.tables import Base

TESTS = Path(__file__).resolve().parent

SCRIPT = """
import os, sys, time
sys.path.insert(0, {tests!r})
import test_loop
from coevo.errors import NotFound
from coevo.loop import run_coevolution
tmp, url, name = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = test_loop.config(tmp, "gated", rounds=2, name=name)
store, parts = test_loop.build(tmp, cfg, url)
slow = float(os.environ.get("COEVO_TEST_SLOW_PROPOSER", 0))
if slow:  # a proposer whose first call takes `slow` seconds: the run holds its lease that long
    proposer, calls = parts.proposers[0], []
    def propose(ctx, _inner=proposer.propose):
        if not calls:
            time.sleep(slow)
        calls.append(1)
        return _inner(ctx)
    proposer.propose = propose
try:
    store.get_run(name)
except NotFound:  # killed before the run was created: start it (what a user would do)
    resume = None
else:
    resume = name
run_coevolution(cfg, store, parts, resume=resume)
"""


def _cmd(tmp: Path, url: str, name: str = "crash") -> list[str]:
    return [sys.executable, "-c", SCRIPT.format(tests=str(TESTS)), str(tmp), url, name]


def _env(kill_at: str | None = None, slow_proposer: float = 0) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COEVO_TEST_KILL_AT", None)
    if kill_at:
        env["COEVO_TEST_KILL_AT"] = kill_at
    env["COEVO_TEST_SLOW_PROPOSER"] = str(slow_proposer)
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


def decisions(url: str, name: str = "crash") -> list[tuple]:
    store = Store.open(url)
    run = store.get_run(name)
    out = sorted((p.round, p.rationale, p.status, d.accepted, d.policy, d.reason)
                 for p in store.proposals(run=run.id) for d in store.decisions(p.id))
    store.close()
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(snapshot, decisions, wall seconds, seconds until the run's lease was taken, seconds
    it was held, rows stored) of the uninterrupted run."""
    tmp = tmp_path_factory.mktemp("ref")
    url = f"sqlite:///{tmp / 'ref.db'}"
    times = timed_run(tmp, url)
    return (snapshot(url, tmp), decisions(url), *times, stored_rows(url))


def timed_run(tmp: Path, url: str) -> tuple[float, float, float]:
    """Run to the end; (wall seconds, seconds until the process held the run's lease: module
    imports, model building, run creation; seconds it held the lease: the loop's work)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(_cmd(tmp, url), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert _wait_for_lease(url, "crash", proc) is not None, proc.communicate()[1].decode()[-3000:]
    startup = time.perf_counter() - t0
    store = Store.open(url)
    while proc.poll() is None and store.lease_holder("crash") is not None:
        time.sleep(0.05)
    store.close()
    work = time.perf_counter() - t0 - startup
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-3000:]
    return time.perf_counter() - t0, startup, work


def _check(reference, url: str, tmp: Path) -> None:
    want, want_decisions = reference[:2]
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


def stored_rows(url: str) -> int:
    """Rows in every coevo table (0 before the run created its store)."""
    store = Store.open(url)
    with store.engine.connect() as conn:
        n = sum(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables)
    store.close()
    return n


def kill_chain(tmp: Path, url: str, moments: list[tuple[str, float]], kills: int,
               total_rows: int | None = None) -> list[int]:
    """Start the run and SIGKILL it at `moments[0]`, then resume it and kill the resume at
    `moments[1]`, and so on, until `kills` processes were killed. A moment ("start", s) is s
    seconds after the process started (imports, model building, run creation); ("lease", s)
    is s seconds after it took the run's lease (the loop's work), so that on a machine of any
    load a kill lands in the work, not always in the imports. Returns the rows stored after
    each kill (a process that finished before its moment adds no entry). The caller resumes
    once more, to the end. With `total_rows` (the uninterrupted run's), a "lease" moment is
    scaled by the share of the rows still to store, so that kills keep landing in the work
    that is left instead of after a resume has finished it."""
    rows: list[int] = []
    for origin, seconds in moments:
        if len(rows) >= kills:
            break
        if origin == "lease" and total_rows:
            seconds *= max(0.05, 1.0 - stored_rows(url) / total_rows)
        proc = subprocess.Popen(_cmd(tmp, url), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            if origin == "lease":
                _wait_for_lease(url, "crash", proc)
            _, err = proc.communicate(timeout=seconds)
            assert proc.returncode == 0, err.decode()[-3000:]
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
            rows.append(stored_rows(url))
    return rows


def random_moments(seed: int, n: int, startup: float, work: float) -> list[tuple[str, float]]:
    """The seeded kill moments: the first in the start-up, the rest 20-100% of the time the
    uninterrupted run held its lease after a resume took it (a resume first redoes the
    uncommitted part of what it was killed in, an RL step or an evaluation, before it stores
    anything new; a later moment can fall after the run finished)."""
    rng = random.Random(seed)
    return [("start", startup * rng.uniform(0.2, 0.7))] + [
        ("lease", work * rng.uniform(0.2, 1.0)) for _ in range(n - 1)]


def test_random_kills_of_a_run_and_of_its_resumes_then_resume_equals_uninterrupted(
        reference, tmp_path):
    """Ten SIGKILLs at seeded random wall-clock moments of ONE run: the run itself is killed,
    then each resume of it, nine times (a kill can land anywhere: a module import, the RL
    stage, a checkpoint write, an evaluation, a store transaction, the final test); the last
    resume finishes and every table equals the uninterrupted run's. Wall-clock moments cannot
    promise where the run will be: when a resume finishes the run before ten kills landed,
    another chain (a fresh store, the next seed) takes the remaining kills, and every chain is
    checked the same way."""
    kills: list[list[int]] = []
    for c in range(4):
        if sum(map(len, kills)) >= 10:
            break
        tmp = tmp_path / f"chain{c}"
        tmp.mkdir()
        url = f"sqlite:///{tmp / 'c.db'}"
        rows = kill_chain(tmp, url, random_moments(15 + c, 24, *reference[3:5]),
                          kills=10 - sum(map(len, kills)), total_rows=reference[5])
        print(f"chain {c}: rows stored after each kill:", rows)
        kills.append(rows)
        assert _run(tmp, url) == 0
        _check(reference, url, tmp)
    assert sum(map(len, kills)) == 10
    assert len(kills[0]) >= 2 and kills[0][0] < max(kills[0])  # resumes were killed too


def _wait_for_lease(url: str, name: str, proc: subprocess.Popen) -> dict | None:
    """Wait until `proc` holds run `name`'s lease (a killed predecessor's row may still be
    there); the holder, or None when `proc` ended first."""
    store = Store.open(url)
    try:
        for _ in range(6000):
            if proc.poll() is not None:
                return None
            try:
                holder = store.lease_holder(name)
            except NotFound:  # the run is not created yet
                holder = None
            if holder is not None and holder["pid"] == proc.pid:
                return holder
            time.sleep(0.05)
    finally:
        store.close()
    raise AssertionError(f"process {proc.pid} never took the lease of run {name}")


def test_a_second_process_on_the_same_run_is_refused_and_stores_nothing(reference, db_url,
                                                                        tmp_path):
    (tmp_path / "a").mkdir()
    # The first process holds the lease for a minute at least (its proposer is slow), time
    # for the second to start up and reach the lease.
    first = subprocess.Popen(_cmd(tmp_path / "a", db_url), env=_env(slow_proposer=60),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert _wait_for_lease(db_url, "crash", first) is not None
    second = subprocess.run(_cmd(tmp_path / "a", db_url), env=_env(), capture_output=True,
                            text=True, timeout=600)  # the same config, hence the same folder
    last = second.stderr.strip().splitlines()[-1]
    assert second.returncode == 1 and re.search(
        rf"CoevoError: run crash is being executed by pid {first.pid} on host \S+ since "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", last), second.stderr[-3000:]
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err.decode()[-3000:]
    want, want_decisions = reference[:2]
    got = snapshot(db_url, tmp_path / "a")
    for table in want:  # exactly the uninterrupted run: the refused process wrote nothing
        assert got[table] == want[table], f"table {table} differs"
    assert decisions(db_url) == want_decisions


def test_two_different_runs_at_once_both_complete(reference, db_url, tmp_path):
    procs = []
    for name in ("crash", "other"):
        (tmp_path / name).mkdir()
        procs.append(subprocess.Popen(_cmd(tmp_path / name, db_url, name), env=_env(),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err.decode()[-3000:]
    store = Store.open(db_url)
    assert [(r.name, r.status) for r in store.runs()] in (
        [("crash", "done"), ("other", "done")], [("other", "done"), ("crash", "done")])
    n = {r.name: (len(store.trajectories(run=r.id)), len(store.proposals(run=r.id)),
                  len(store.rounds(r.id))) for r in store.runs()}
    store.close()
    assert n["crash"] == n["other"]
    assert decisions(db_url, "crash") == decisions(db_url, "other") == reference[1]
