"""Human reviews in the store (coevo/store/reviews.py): who may review what, one review per
proposal, the candidates a run holds for review derived from the rows, and migration 0007
(reviews table; one decision per proposal and policy)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from coevo.assets.base import Asset
from coevo.errors import CoevoError, NotFound
from coevo.store import Store
from coevo.store.engine import make_engine


class ReviewNote(Asset):
    kind = "testreviewnote"
    text: str = ""


@pytest.fixture
def store(db_url):
    s = Store.open(db_url)
    yield s
    s.close()


def _held(store: Store, text: str = "new", accepted: bool = True, hold: bool = True) -> str:
    """A proposal the gate decided on; with `hold`, an accepted one stays pending review."""
    parent = ReviewNote(name="h", text="old")
    store.put_asset(parent)
    try:
        store.get_run("r")
    except NotFound:
        store.create_run("r")
    pid = store.add_proposal(proposer="lm", kind=parent.kind, parent=parent.hash,
                             candidate=parent.child(text=text), run="r")
    store.add_decision(pid, policy="paired", accepted=accepted, reason="p=0.01",
                       status="pending" if hold and accepted else None)
    return pid


def test_a_held_candidate_awaits_review_until_reviewed_once(store):
    held, plain = _held(store, "a"), _held(store, "b", hold=False)
    rejected = _held(store, "c", accepted=False)
    assert store.get_proposal(held).status == "pending"
    assert [p.id for p in store.awaiting_review("r")] == [held]
    rid = store.add_review(held, decision="approve", by=" alice ", note="<b>ok</b>")
    [rv] = store.reviews(proposal=held)
    assert (rv.id, rv.proposal, rv.by, rv.decision, rv.note) == (rid, held, "alice", "approve",
                                                                  "<b>ok</b>")
    assert store.reviews(run="r") == [rv]
    # Reviewing does not apply it: the loop does, at the next round start.
    assert [p.id for p in store.awaiting_review("r")] == [held]
    with pytest.raises(CoevoError, match=r"already reviewed: approve by alice"):
        store.add_review(held, decision="veto", by="bob")
    with pytest.raises(CoevoError, match=r"is accepted, not pending review"):
        store.add_review(plain, decision="approve", by="bob")
    with pytest.raises(CoevoError, match=r"is rejected, not pending review"):
        store.add_review(rejected, decision="approve", by="bob")
    assert store.reviews(run="r") == [rv]


def test_bad_review_input_is_refused_with_one_line(store):
    held = _held(store)
    ungated = store.add_proposal(proposer="lm", kind="testreviewnote", parent=None,
                                 candidate=ReviewNote(name="x", text="y"), run="r")
    with pytest.raises(NotFound, match="no proposal 'nope'"):
        store.add_review("nope", decision="approve", by="a")
    with pytest.raises(CoevoError, match="expected approve or veto"):
        store.add_review(held, decision="maybe", by="a")
    with pytest.raises(CoevoError, match="reviewer's name"):
        store.add_review(held, decision="veto", by="  ")
    with pytest.raises(CoevoError, match="the gate has not accepted it"):
        store.add_review(ungated, decision="approve", by="a")
    assert store.reviews() == []


def test_the_review_decision_sits_next_to_the_gate_decision(store):
    held = _held(store)
    store.add_review(held, decision="veto", by="bob")
    store.add_decision(held, policy="review", accepted=False, reason="vetoed by bob")
    assert [(d.policy, d.accepted) for d in store.decisions(held)] == [("paired", True),
                                                                       ("review", False)]
    assert store.get_proposal(held).status == "rejected"
    assert store.awaiting_review("r") == []
    with pytest.raises(CoevoError, match="rejected the write"):  # applied once, never twice
        store.add_decision(held, policy="review", accepted=False, reason="again")


def test_upgrade_from_0005_adds_reviews_and_keeps_decisions(db_url):
    old = Store(make_engine(db_url))
    old.upgrade("0005")
    note = ReviewNote(name="seed", text="a")
    child = note.child(text="b")
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with old.engine.begin() as conn:
        from test_migrations import _insert, versions_and_run

        versions_and_run(conn, (note, child), now)
        _insert(conn, "proposals", id="p1", run_id="run1", round=None, proposer="lm",
                kind=note.kind, parent_hash=note.hash, candidate_hash=child.hash,
                status="pending", rationale="", predicted_effect="", prompt="", raw_output="",
                diff=json.dumps({}), model="m", created_at=now)
        _insert(conn, "decisions", id="d1", proposal_id="p1", policy="paired", accepted=True,
                reason="ok", statistic=json.dumps({}), rollouts=4, metric="", created_at=now)
    old.close()
    store = Store.open(db_url)
    assert store.current_revision() == "0007"
    assert [p.id for p in store.awaiting_review("r")] == ["p1"]
    store.add_review("p1", decision="approve", by="carol")
    store.add_decision("p1", policy="review", accepted=True, reason="approved by carol")
    assert [d.policy for d in store.decisions("p1")] == ["paired", "review"]
    with pytest.raises(CoevoError, match="rejected the write"):
        store.add_decision("p1", policy="paired", accepted=False, reason="again")
    store.close()


def test_cli_approve_and_veto(tmp_path):
    from typer.testing import CliRunner

    from coevo.cli import app

    runner = CliRunner()
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = Store.open(db)
    held, plain = _held(store, "a"), _held(store, "b", hold=False)
    r = runner.invoke(app, ["proposals", "approve", held[:8], "--by", "alice", "--note", "fine",
                            "--db", db])
    assert r.exit_code == 0, r.output
    assert f"approve of proposal {held[:12]} by alice recorded" in r.output
    [rv] = store.reviews(proposal=held)
    assert (rv.by, rv.decision, rv.note) == ("alice", "approve", "fine")
    r = runner.invoke(app, ["proposals", "show", held[:8], "--db", db])
    assert r.exit_code == 0 and "awaiting human review" in r.output
    assert f"review {rv.id[:12]}: approve by alice at" in r.output and ": fine" in r.output
    for args, message in (
            (["veto", held, "--by", "bob"], "already reviewed: approve by alice"),
            (["veto", plain, "--by", "bob"], "is accepted, not pending review"),
            (["approve", "f" * 32, "--by", "bob"], "no proposal with id or id prefix"),
            (["veto", held], "Missing option '--by'")):
        r = runner.invoke(app, ["proposals", *args, "--db", db])
        assert r.exit_code != 0 and message in r.output, r.output
    assert store.reviews() == [rv]
    store.close()
