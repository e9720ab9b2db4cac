"""What the list and show commands print for scripts (coevo/cli_output.py): `--json` is one
document on stdout holding the stored records, and in a pipe (CliRunner's stdout is not a
terminal) tables are tab-separated lines with every cell whole, whatever the width."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

import coevo.cli
from coevo.assets import load_asset
from coevo.cli import app
from coevo.store import Store
from conftest import REPO
from test_audit import ACCEPT_REASON, INVALID_ERROR, REJECT_REASON, populate

runner = CliRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The audit scenario (a run, two rounds, proposals in every status) plus the seed assets."""
    db = f"sqlite:///{tmp_path_factory.mktemp('out') / 'o.db'}"
    r = runner.invoke(app, ["init", "--assets", str(REPO), "--db", db])
    assert r.exit_code == 0, r.output
    store = Store.open(db)
    yield db, store, populate(store)
    store.close()


def cli_json(db, *args):
    r = runner.invoke(app, [*args, "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # the whole of stdout is one document


def dump(record):
    return record.model_dump(mode="json")


def with_decisions(store, p):
    return {**dump(p), "decisions": [dump(d) for d in store.decisions(p.id)],
            "reviews": [dump(v) for v in store.reviews(proposal=p.id)]}


def test_runs_list_and_show_json_are_the_stored_rows(world):
    db, store, sc = world
    runs = cli_json(db, "runs", "list")
    assert runs == [{**dump(r), "shown_status": store.shown_status(r)} for r in store.runs()]
    assert [(r["status"], r["shown_status"]) for r in runs] == [(store.runs()[0].status,) * 2]
    assert [(r["name"], r["config"]["budget"]["max_rollouts"]) for r in runs] == [("exp1", 200)]
    doc = cli_json(db, "runs", "show", "exp1")
    assert doc["run"] == {**dump(store.get_run("exp1")), "shown_status": store.get_run("exp1").status}
    assert doc["rounds"] == [dump(r) for r in store.rounds(sc.run.id)]
    assert doc["rounds"][0]["summary"]["val_score"] == 0.5
    assert doc["rounds"][1]["summary"]["evaluations"] == {"val": sc.ev}
    assert {b["kind"]: (b["spent"], b["limit"]) for b in doc["budgets"]} == {
        "proposer_calls": (3.0, None), "rollouts": (160.0, 200.0), "tokens": (5000.0, 10000.0)}
    assert [c["id"] for c in doc["checkpoints"]] == [sc.ck[0].id, sc.ck[1].id]
    assert doc["checkpoints"][1] == dump(store.get_checkpoint(sc.ck[1].id))


def test_proposals_list_and_show_json_carry_decisions_and_evidence(world):
    db, store, sc = world
    listed = cli_json(db, "proposals", "list")
    assert listed == [with_decisions(store, p) for p in store.proposals()]
    assert [p["id"] for p in listed] == [sc.acc, sc.inv, sc.rej, sc.pend]
    assert [p["status"] for p in listed] == ["accepted", "invalid", "rejected", "pending"]
    [rej] = cli_json(db, "proposals", "list", "--run", "exp1", "--status", "rejected")
    assert rej["id"] == sc.rej and rej["decisions"][0]["reason"] == REJECT_REASON
    shown = cli_json(db, "proposals", "show", sc.acc[:8])
    assert shown == with_decisions(store, store.get_proposal(sc.acc))
    [d] = shown["decisions"]
    assert d["reason"] == ACCEPT_REASON and d["statistic"]["p_adjusted"] == 0.125
    assert [(e["task_id"], e["incumbent"], e["candidate"]) for e in d["evidence"]][:2] == [
        ("simple_1", 0.0, 1.0), ("simple_2", 1.0, 1.0)]
    assert cli_json(db, "proposals", "show", sc.inv)["error"] == INVALID_ERROR


def test_lineage_json(world):
    db, store, sc = world
    h0, h1, h2, _ = sc.h
    doc = cli_json(db, "lineage", h1.hash[:10])
    assert doc["version"] == dump(store.resolve("harness", h1.hash))
    assert [a["hash"] for a in doc["ancestors"]] == [h0.hash]
    assert [d["hash"] for d in doc["descendants"]] == [h2.hash]
    assert sorted(p["id"] for p in doc["proposals"]) == sorted([sc.acc, sc.rej])
    assert {p["candidate"]: p["status"] for p in doc["proposals"]} == {h1.hash: "accepted",
                                                                     h2.hash: "rejected"}


@pytest.mark.parametrize("group,kind,seed", [
    ("harness", "harness", "harnesses/function_calling.yaml"),
    ("skills", "skill", "skills/function-call-format/SKILL.md"),
    ("rubrics", "rubric", "rubrics/reasoning.yaml")])
def test_asset_list_and_show_json(world, group, kind, seed):
    db, store, _ = world
    assert cli_json(db, group, "list") == [dump(r) for r in store.list_assets(kind)]
    asset = load_asset(REPO / seed)  # read from its file, apart from the store
    doc = cli_json(db, group, "show", asset.name)
    assert (doc["hash"], doc["kind"], doc["name"]) == (asset.hash, kind, asset.name)
    assert doc["content"] == asset.content()


def test_json_escapes_terminal_controls_and_keeps_text(tmp_path):
    db = f"sqlite:///{tmp_path / 'x.db'}"
    store = Store.open(db)
    sc = populate(store)
    pid = store.add_proposal(proposer="harness", kind="harness", parent=sc.h[0].hash,
                             candidate=None, run=sc.run.id, round=1, status="invalid",
                             error="bad", rationale="clear\x1b[2J \u202e\x9bévité")
    r = runner.invoke(app, ["proposals", "show", pid, "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    for raw in ("\x1b", "\u202e", "\x9b"):
        assert raw not in r.stdout
    assert "évité" in r.stdout  # UTF-8 text stays readable
    assert json.loads(r.stdout)["rationale"] == "clear\x1b[2J \u202e\x9bévité"


def test_proposals_list_in_a_pipe_is_whole_cells_at_80_columns(world, monkeypatch):
    db, store, sc = world
    monkeypatch.setattr(coevo.cli, "console", Console(width=80))  # not a terminal: a pipe
    r = runner.invoke(app, ["proposals", "list", "--db", db])
    assert r.exit_code == 0, r.output
    header, *rows = [line.split("\t") for line in r.output.splitlines()]
    assert header == ["id", "round", "proposer", "kind", "status", "parent", "candidate",
                      "diff", "p", "rollouts", "reason"]
    assert all(len(row) == len(header) for row in rows)  # one line a row, no folded cell
    got = {row[0]: (row[4], row[10]) for row in rows}
    assert got == {sc.acc[:12]: ("accepted", ACCEPT_REASON), sc.inv[:12]: ("invalid", INVALID_ERROR),
                   sc.rej[:12]: ("rejected", REJECT_REASON), sc.pend[:12]: ("pending", "")}
    assert max(len(line) for line in r.output.splitlines()) > 80  # nothing wrapped to fit
    assert "\x1b" not in r.output and "│" not in r.output


def test_show_views_in_a_pipe_are_titled_sections(world, monkeypatch):
    db, _, sc = world
    monkeypatch.setattr(coevo.cli, "console", Console(width=80))
    out = runner.invoke(app, ["runs", "show", "exp1", "--db", db]).output
    rounds = out.split("# rounds\n")[1].split("\n\n")[0].splitlines()
    assert [line.split("\t")[:4] for line in rounds] == [
        ["round", "status", "val", "test"], ["0", "done", "0.500", "-"], ["1", "done", "0.667", "0.450"]]
    assert "# budgets\nkind\tspent\tlimit\tused\n" in out and "rollouts\t160\t200\t80%\n" in out
    out = runner.invoke(app, ["proposals", "show", sc.rej, "--db", db]).output
    assert f"proposal\t{sc.rej}\n" in out and f"# reason\n{REJECT_REASON}\n" in out
    out = runner.invoke(app, ["lineage", sc.h[1].hash, "--db", db]).output
    h0, h1, h2, _ = sc.h  # root, this version, its child: one node a line, indented a level
    assert [line.split("  harness base")[0] for line in out.splitlines()] == [
        h0.hash[:12], "  " + h1.hash[:12], "    " + h2.hash[:12]]


def test_a_terminal_still_gets_the_rich_table(world, monkeypatch):
    import io

    db, _, _ = world
    buf = io.StringIO()
    monkeypatch.setattr(coevo.cli, "console", Console(file=buf, force_terminal=True, width=200))
    assert runner.invoke(app, ["proposals", "list", "--db", db]).exit_code == 0
    assert "┏" in buf.getvalue() and "rejected" in buf.getvalue()
