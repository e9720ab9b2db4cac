"""Crash and resume: the loop runs in a subprocess that is SIGKILLed at a named point, then
resumed; the stored proposals, decisions, evidence and rounds equal an uninterrupted run's
(no duplicates, no lost accepted versions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.store import Store

TESTS = Path(__file__).resolve().parent

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import test_loop
from coevo.loop import run_coevolution
tmp, url, resume = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else None)
cfg = test_loop.config(tmp, "gated", rounds=2, name="crash")
store, parts = test_loop.build(tmp, cfg, url)
run_coevolution(cfg, store, parts, resume=resume)
"""


def _run(tmp: Path, url: str, kill_at: str | None = None, resume: str | None = None) -> int:
    env = dict(os.environ)
    env.pop("COEVO_TEST_KILL_AT", None)
    if kill_at:
        env["COEVO_TEST_KILL_AT"] = kill_at
    args = [sys.executable, "-c", SCRIPT.format(tests=str(TESTS)), str(tmp), url]
    if resume:
        args.append(resume)
    return subprocess.run(args, env=env, capture_output=True, timeout=600).returncode


def _snapshot(url: str):
    store = Store.open(url)
    run = store.get_run("crash")
    props = sorted((p.round, p.proposer, p.rationale, p.status, p.candidate)
                   for p in store.proposals(run=run.id))
    decisions = sorted(
        (p.rationale, d.accepted, d.policy, tuple((e.task_id, e.incumbent, e.candidate)
                                                  for e in d.evidence))
        for p in store.proposals(run=run.id) for d in store.decisions(p.id))
    rounds = [(r.index, r.status, (r.summary.get("incumbent") or {}).get("harness"))
              for r in store.rounds(run.id)]
    return run.status, props, decisions, rounds


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    url = f"sqlite:///{tmp / 'ref.db'}"
    assert _run(tmp, url) == 0
    return _snapshot(url)


@pytest.mark.parametrize("point", ["after_rl:0", "after_proposals:0", "after_decisions:1",
                                   "before_final"])
def test_kill_then_resume_equals_uninterrupted(reference, tmp_path, point):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    assert _run(tmp_path, url, kill_at=point) == -9  # really killed there
    assert _run(tmp_path, url, resume="crash") == 0
    got = _snapshot(url)
    assert got == reference
    status, props, decisions, rounds = got
    assert any(p[3] == "accepted" for p in props)  # the helpful candidate survived the crash
    assert len(decisions) == len({d[0:1] + d[3:] for d in decisions})  # no duplicate decision
