"""Alembic migrations: a blank database migrates to exactly the ORM's schema, and a database
left at revision 0001 with data in it upgrades to head keeping that data (as simonw/llm's
tests/test_migrate.py does for its migrations). Runs on SQLite and, with COEVO_TEST_PG_URL,
on PostgreSQL."""

from __future__ import annotations

import json
import os
import tomllib
from datetime import datetime, timezone
from fnmatch import fnmatch
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from coevo.assets.base import Asset
from coevo.errors import CoevoError
from coevo.store import Store, codec
from coevo.store.engine import make_engine
from coevo.store.store import MIGRATIONS
from coevo.store.tables import Base

REPO = Path(__file__).resolve().parent.parent


class MigNote(Asset):
    kind = "testmignote"
    text: str = ""


def test_blank_database_migrates_to_the_orm_schema(db_url):
    store = Store(make_engine(db_url))
    assert store.current_revision() is None
    store.upgrade()
    assert store.current_revision() == store.head_revision() == HEAD
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}),
                                 Base.metadata)
        tables = set(sa.inspect(conn).get_table_names())
    assert diffs == []
    assert tables == set(Base.metadata.tables) | {"alembic_version"}
    store.close()


def test_schema_checker_sees_a_difference(db_url):
    """The comparison above can fail: stopping at 0001 leaves the budget ledger (and the later
    run leases and reviews) missing."""
    store = Store(make_engine(db_url))
    store.upgrade("0001")
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    added = {d[1].name for d in diffs if d[0] == "add_table"}
    indexes = {d[1].name for d in diffs if d[0] == "add_index"}
    assert added == {"budgets", "run_leases", "reviews"}
    assert {"ix_trajectories_harness_hash", "ix_proposals_run_id_status"} <= indexes
    store.close()


HEAD = "0007"


def _insert(conn: sa.Connection, table: str, **values) -> None:
    cols = ", ".join(f'"{k}"' for k in values)
    params = ", ".join(f":{k}" for k in values)
    conn.execute(sa.text(f'INSERT INTO {table} ({cols}) VALUES ({params})'), values)


def versions_and_run(conn: sa.Connection, assets, now: datetime) -> None:
    """Asset version rows and a run "r" (id run1), as every revision has stored them."""
    for a in assets:
        _insert(conn, "asset_versions", hash=a.hash, kind=a.kind, name=a.name,
                parent_hash=a.parent, content=json.dumps(a.content()), created_at=now)
    _insert(conn, "runs", id="run1", name="r", config=json.dumps({}), mode="gated",
            status="running", created_at=now, updated_at=now)


def test_upgrade_from_0001_keeps_data(db_url):
    old = Store(make_engine(db_url))
    old.upgrade("0001")
    note = MigNote(name="seed", text="hello")
    child = note.child(text="hello again")
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    ids, mask, lps = [5, 6, 7, 49151], [0, 0, 1, 1], [0.0, 0.0, -0.25, -1.5]
    # Rows as coevo at revision 0001 wrote them, in plain SQL: the old schema, not the ORM's.
    with old.engine.begin() as conn:
        for a in (note, child):
            _insert(conn, "asset_versions", hash=a.hash, kind=a.kind, name=a.name,
                    parent_hash=a.parent, content=json.dumps(a.content()), created_at=now)
        _insert(conn, "runs", id="run1", name="old-run", config=json.dumps({"seed": 1}),
                mode="gated", status="running", created_at=now, updated_at=now)
        _insert(conn, "rounds", run_id="run1", index=0, status="done", started_at=now,
                summary=json.dumps({"reward": 0.5}))
        _insert(conn, "trajectories", id="t1", run_id="run1", round=0, env="toy", task_id="k1",
                split="train", sample_index=0, seed=3, status="ok", success=True, outcome=1.0,
                reward=0.75, criteria=json.dumps({"format": 1.0}), messages=json.dumps(
                    [{"role": "user", "content": "hi"}]), turns=json.dumps([]),
                token_ids=codec.pack_ids(ids), loss_mask=codec.pack_mask(mask),
                logprobs=codec.pack_logprobs(lps), n_tokens=4, prompt_len=2, trainable=True,
                active_skills=json.dumps([]), harness_hash=child.hash, model="m",
                timings=json.dumps({"generate": 0.1}), created_at=now)
        _insert(conn, "proposals", id="p1", run_id="run1", round=0, proposer="lm", kind=note.kind,
                parent_hash=note.hash, candidate_hash=child.hash, status="accepted",
                rationale="r", predicted_effect="+", prompt="", raw_output="",
                diff=json.dumps({"text": "..."}), created_at=now)
    old.close()

    store = Store.open(db_url)  # opening migrates to head
    assert store.current_revision() == HEAD
    assert store.get_asset("testmignote", "seed") == child  # latest version of that name
    assert [r.hash for r in store.ancestors(child.hash)] == [note.hash]
    assert store.get_run("old-run").config == {"seed": 1}
    assert store.get_round("old-run", 0).summary == {"reward": 0.5}
    (t,) = store.trajectories(harness=child.hash)  # served by 0002's new index
    assert (t.id, t.token_ids, t.loss_mask, t.logprobs) == ("t1", ids, mask, lps)
    assert t.criteria == {"format": 1.0} and t.reward == 0.75
    assert [p.id for p in store.proposals(run="run1", status="accepted")] == ["p1"]
    store.add_budget("old-run", "rollouts", 8, round=0)  # the table 0002 added
    assert store.budget_totals("old-run") == {"rollouts": 8.0}
    store.close()


def test_database_from_a_newer_coevo_is_a_clear_error(db_url):
    store = Store.open(db_url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(CoevoError, match=f"9999.*newest revision is {HEAD}"):
        store.upgrade()
    store.close()


def test_open_without_migrate_leaves_blank_database(tmp_path):
    store = Store.open(str(tmp_path / "x.db"), migrate=False)
    assert store.current_revision() is None
    assert store.head_revision() == HEAD
    store.upgrade("0001")
    assert store.current_revision() == "0001"
    store.close()


def test_migration_files_are_package_data():
    """Opening a store from an installed wheel needs env.py and every revision: each must be
    matched by a pyproject package-data pattern (relative to the coevo package)."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["coevo"]
    needed = [MIGRATIONS / "env.py", *sorted((MIGRATIONS / "versions").glob("*.py"))]
    assert len(needed) >= 3
    for path in needed:
        rel = path.relative_to(REPO / "coevo").as_posix()
        assert any(fnmatch(rel, p) for p in patterns), f"{rel} is not package data"


def test_upgrade_from_0003_keeps_data_and_enforces_the_idempotency_keys(db_url):
    """Revision 0004 adds the keys a resume relies on: rows written at 0003 keep their values
    (no key, no partials, no stages), and from 0004 on the unique constraints refuse a second
    decision for a proposal, a second proposal of the same candidate by the same proposer in a
    round, and a second charge or evaluation under one key."""
    old = Store(make_engine(db_url))
    old.upgrade("0003")
    note = MigNote(name="seed", text="a")
    child = note.child(text="b")
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with old.engine.begin() as conn:
        versions_and_run(conn, (note, child), now)
        _insert(conn, "rounds", run_id="run1", index=0, status="done", started_at=now,
                summary=json.dumps({}))
        _insert(conn, "proposals", id="p1", run_id="run1", round=0, proposer="lm", kind=note.kind,
                parent_hash=note.hash, candidate_hash=child.hash, status="accepted",
                rationale="", predicted_effect="", prompt="", raw_output="",
                diff=json.dumps({}), model="m", created_at=now)
        _insert(conn, "decisions", id="d1", proposal_id="p1", policy="paired", accepted=True,
                reason="ok", statistic=json.dumps({"p_value": 0.01}), rollouts=4, created_at=now)
        _insert(conn, "evidence", decision_id="d1", proposal_id="p1", task_id="t", sample=0,
                incumbent=0.0, candidate=1.0, status="ok")
        _insert(conn, "budgets", run_id="run1", round=0, kind="rollouts", amount=4.0,
                created_at=now)
    old.close()

    store = Store.open(db_url)
    assert store.current_revision() == HEAD
    [d] = store.decisions("p1")
    assert (d.reason, d.metric, d.stages, d.statistic) == ("ok", "", [], {"p_value": 0.01})
    [e] = d.evidence
    assert (e.incumbent, e.candidate, e.incumbent_partial, e.candidate_partial) == (0.0, 1.0, None, None)
    assert store.budget_totals("r") == {"rollouts": 4.0}
    with pytest.raises(CoevoError, match="rejected the write"):
        store.add_decision("p1", policy="paired", accepted=False, reason="again")
    with pytest.raises(CoevoError, match="rejected the write"):
        store.add_proposal(proposer="lm", kind=note.kind, parent=note.hash, candidate=child.hash,
                           run="r", round=0)
    store.add_budget("r", "rollouts", 6, round=0, key="rl:0:1")
    store.add_budget("r", "rollouts", 6, round=0, key="rl:0:1")  # redone after a crash: once
    assert store.budget_totals("r") == {"rollouts": 10.0}
    assert store.budget_totals("r", exclude_prefix="rl:") == {"rollouts": 4.0}
    ev = store.create_evaluation(split="val", env="toy", run="r", round=0, key="k" * 64)
    assert store.find_evaluation("k" * 64) == ev and store.get_evaluation(ev).key == "k" * 64
    with pytest.raises(CoevoError, match="rejected the write"):
        store.create_evaluation(split="val", env="toy", key="k" * 64)
    with store.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
        _insert(conn, "budgets", run_id="run1", round=0, kind="rollouts", amount=1.0,
                key="rl:0:1", created_at=now)  # the constraint itself, below the API
    store.close()


def test_upgrade_from_0004_adds_policy_step_and_keeps_trajectories(db_url):
    """Revision 0005: trajectories stored before it read back with policy_step None; new RL
    rollouts store theirs."""
    old = Store(make_engine(db_url))
    old.upgrade("0004")
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with old.engine.begin() as conn:
        _insert(conn, "trajectories", id="t1", env="toy", task_id="k1", split="train",
                sample_index=0, seed=3, status="ok", success=True, outcome=1.0, reward=1.0,
                criteria=json.dumps({}), messages=json.dumps([]), turns=json.dumps([]),
                token_ids=codec.pack_ids([1, 2]), loss_mask=codec.pack_mask([0, 1]),
                logprobs=codec.pack_logprobs([0.0, -0.5]), n_tokens=2, prompt_len=1,
                trainable=True, active_skills=json.dumps([]), model="m",
                timings=json.dumps({}), created_at=now)
    old.close()
    store = Store.open(db_url)
    assert store.current_revision() == HEAD
    [t] = store.trajectories(ids=["t1"])
    assert t.policy_step is None and t.logprobs == [0.0, -0.5]
    store.add_trajectories([t.model_copy(update={"id": "t2", "policy_step": 7})])
    assert store.trajectories(ids=["t2"])[0].policy_step == 7
    store.close()


def test_upgrade_from_0005_adds_run_leases_and_run_errors(db_url):
    """Revision 0006: a run stored before it reads back with no error and no lease holder; it
    can then be leased (one holder at a time) and marked failed with its error."""
    old = Store(make_engine(db_url))
    old.upgrade("0005")
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with old.engine.begin() as conn:
        _insert(conn, "runs", id="r1", name="old", config=json.dumps({}), mode="gated",
                status="running", created_at=now, updated_at=now)
        assert "run_leases" not in sa.inspect(conn).get_table_names()
    old.close()
    store = Store.open(db_url)
    assert store.current_revision() == HEAD
    rec = store.get_run("old")
    assert (rec.status, rec.error, store.lease_holder("old")) == ("running", None, None)
    with pytest.raises(RuntimeError):
        with store.executing("old"):
            assert store.lease_holder("old")["pid"] == os.getpid()
            raise RuntimeError("boom")
    rec = store.get_run("old")
    assert (rec.status, rec.error, store.lease_holder("old")) == ("failed", "RuntimeError: boom", None)
    store.close()
