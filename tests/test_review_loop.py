"""gate.human_review in the loop (coevo/reviewstep.py) on the tiny-model fixtures of
tests/test_loop.py: a candidate the gate accepts is held pending, the rounds run RL only while
it waits, an approval given between rounds (through the store API) is applied at the next
round start as a decision citing the review, a veto rejects it, and a run killed right after
applying a review resumes without losing or repeating it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from coevo.config import RunConfig
from coevo.loop import run_coevolution

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from test_loop import HELPS, HINT, NO_EFFECT, build, config  # noqa: E402

REVIEWED = {"screen_size": 12, "n_boot": 200, "human_review": True}


def _cfg(tmp, mode: str, rounds: int):
    return config(tmp, mode, rounds=rounds, gate=REVIEWED, name="reviewed")


def _held_run(tmp_path, mode: str, rounds: int):
    cfg = _cfg(tmp_path, mode, rounds)
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    res = run_coevolution(cfg, store, parts)
    props = {p.rationale: p for p in store.proposals(res.run)}
    return store, parts, res, props[HELPS["rationale"]], props[NO_EFFECT["rationale"]]


def test_an_approved_candidate_joins_at_the_next_round_start(tmp_path):
    store, parts, res, helps, style = _held_run(tmp_path, "gated", rounds=2)
    seed = store.get_run(res.run).config["seed"]["harness"]
    # The gate accepted it, the run holds it: pending, one decision, incumbent unchanged.
    assert (helps.status, style.status) == ("pending", "rejected")
    [gate] = store.decisions(helps.id)
    assert gate.accepted and gate.reason.endswith("held for human review")
    assert [p.id for p in store.awaiting_review(res.run)] == [helps.id]
    assert res.incumbent["harness"] == seed
    r0, r1 = res.rounds
    assert r0["accepted"] == [] and "reviews" in r1 and r1["reviews"] == {"approved": [],
                                                                           "rejected": []}
    # Round 1 ran RL only: no proposals, a new checkpoint.
    assert store.proposals(res.run, round=1) == []
    assert r1["incumbent"]["checkpoint"] != r0["incumbent"]["checkpoint"]

    rid = store.add_review(helps.id, decision="approve", by="alice", note="the hint is right")
    again = run_coevolution(_cfg(tmp_path, "gated", 3), store, parts, resume="reviewed")
    decisions = store.decisions(helps.id)
    assert [(d.policy, d.accepted) for d in decisions] == [("paired", True), ("review", True)]
    assert decisions[1].statistic == {"review": rid, "by": "alice", "round": 2}
    assert decisions[1].reason == (f"approved by review {rid[:12]} by alice: the hint is right; "
                                   "applied at the start of round 2")
    assert store.get_proposal(helps.id).status == "accepted"
    r2 = again.rounds[2]
    assert r2["reviews"] == {"approved": [helps.id], "rejected": []}
    assert helps.candidate in r2["accepted"]
    assert again.incumbent["harness"] == helps.candidate
    assert HINT in store.get_asset("harness", again.incumbent["harness"]).system_prompt
    assert r2["val_score"] == 1.0 > r0["val_score"]  # the reviewed revision helps
    # The extended run is tested on its new incumbent, not given the first run's test back.
    assert again.final.harness == helps.candidate and again.final.mean == 1.0 > res.final.mean


def test_a_vetoed_candidate_is_rejected_by_review(tmp_path):
    store, parts, res, helps, _ = _held_run(tmp_path, "harness-only", rounds=1)
    rid = store.add_review(helps.id, decision="veto", by="bob")
    again = run_coevolution(_cfg(tmp_path, "harness-only", 2), store, parts, resume="reviewed")
    gate, review = store.decisions(helps.id)
    assert gate.accepted and (review.policy, review.accepted) == ("review", False)
    assert review.reason == f"vetoed by review {rid[:12]} by bob"
    assert store.get_proposal(helps.id).status == "rejected"
    assert again.rounds[1]["reviews"] == {"approved": [], "rejected": [helps.id]}
    assert again.rounds[1]["incumbent"]["harness"] == res.incumbent["harness"]


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import test_review_loop as t
from coevo.config import RunConfig
from coevo.loop import run_coevolution
tmp, url, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = t._cfg(tmp, "harness-only", rounds)
store, parts = t.build(tmp, cfg, url)
run_coevolution(cfg, store, parts, resume="reviewed")
"""


def _resume(tmp: Path, url: str, rounds: int, kill_at: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "COEVO_TEST_KILL_AT"}
    if kill_at:
        env["COEVO_TEST_KILL_AT"] = kill_at
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(TESTS)), str(tmp), url,
                           str(rounds)], env=env, capture_output=True, timeout=600)
    assert done.returncode in (0, -9), done.stderr.decode()[-3000:]
    return done.returncode


def test_a_kill_right_after_applying_a_review_neither_loses_nor_repeats_it(tmp_path):
    store, _, res, helps, _ = _held_run(tmp_path, "harness-only", rounds=1)
    store.add_review(helps.id, decision="approve", by="carol")
    url = f"sqlite:///{tmp_path / 'loop.db'}"
    assert _resume(tmp_path, url, 2, kill_at="after_reviews:1") == -9
    assert [d.policy for d in store.decisions(helps.id)] == ["paired", "review"]  # applied
    assert store.get_round(res.run, 1).status == "running"
    assert _resume(tmp_path, url, 2) == 0
    assert [d.policy for d in store.decisions(helps.id)] == ["paired", "review"]  # once
    r1 = store.get_round(res.run, 1)
    assert r1.status == "done" and r1.summary["reviews"]["approved"] == [helps.id]
    assert r1.summary["incumbent"]["harness"] == helps.candidate  # replayed, not lost
    assert helps.candidate in r1.summary["accepted"]


def test_a_run_created_before_human_review_existed_still_resumes(tmp_path):
    """Its stored config has no gate.human_review; the key's default is not a changed config."""
    import sqlalchemy as sa

    from coevo.store import tables as T

    cfg = config(tmp_path, "harness-only", rounds=1, name="older")
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    res = run_coevolution(cfg, store, parts)
    rec = store.get_run(res.run)
    older = {**rec.config, "config": {**rec.config["config"], "gate": {
        k: v for k, v in rec.config["config"]["gate"].items() if k != "human_review"}}}
    with store.engine.begin() as conn:
        conn.execute(sa.update(T.Run).where(T.Run.id == res.run).values(config=older))
    # What `coevo run --resume older rounds=2` does: the stored config, overridden.
    again = run_coevolution(RunConfig.of_run(store.get_run("older").config, ["rounds=2"]),
                            store, parts, resume="older")
    assert [r.index for r in store.rounds(res.run)] == [0, 1] and len(again.rounds) == 2
