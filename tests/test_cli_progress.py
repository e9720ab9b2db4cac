"""Progress of the long commands: the library reports counts, (phase, done, total), for the
episodes of an evaluation, the RL steps of a stage and the episodes of a gate comparison;
`coevo eval` and `coevo run` show them as bars with N/N on a terminal (coevo/cli_progress.py)
and show nothing of them in a pipe."""

from __future__ import annotations

import io
import json

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

import coevo.cli
import coevo.loop
from coevo.cli import app
from coevo.cli_progress import Bars
from coevo.evaluate import evaluate
from coevo.executors import AgentAssets
from coevo.loop import run_coevolution
from coevo.models.registry import BACKENDS
from coevo.models.scripted import ScriptedBackend
from coevo.store import Store
from tiny_glue import FirstCharEnv, tiny_harness

runner = CliRunner()
ENV = "tiny_glue:FirstCharEnv"  # a plugin spec: tasks "Say something about i."


def even_tasks_pass(request, index):
    """FirstCharEnv scores a reply by its first character, a letter: tasks 0, 2, 4, ... pass."""
    i = int(request.messages[-1]["content"].split()[-1].rstrip("."))
    return "a fine" if i % 2 == 0 else "9 no"


@pytest.fixture
def eval_db(tmp_path, monkeypatch):
    monkeypatch.setitem(BACKENDS._items, "scripted", lambda arg, **o: ScriptedBackend(even_tasks_pass))
    db = f"sqlite:///{tmp_path / 'e.db'}"
    with Store.open(db) as store:
        store.put_asset(tiny_harness())
    return db


def eval_args(db, n=5):
    return ["eval", "--harness", "tiny", "--env", ENV, "--split", "val", "--n", str(n),
            "--model", "scripted", "--db", db]


def terminal_console(buf):
    """A terminal console (cursor control, no colours, so the text is easy to look for)."""
    return Console(file=buf, force_terminal=True, color_system=None, width=120)


@pytest.fixture
def bar_events(monkeypatch):
    """Every (phase, done, total) the CLI's bars are given, recorded on the way in."""
    events, draw = [], Bars.__call__
    monkeypatch.setattr(Bars, "__call__", lambda self, *e: (events.append(e), draw(self, *e))[1])
    return events


def test_evaluate_counts_every_episode_once(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    calls = []
    res = evaluate(store, FirstCharEnv(size=5), AgentAssets(harness=tiny_harness()),
                   ScriptedBackend(even_tasks_pass), split="val", samples=2,
                   progress=lambda done, total: calls.append((done, total)))
    assert calls == [(k, 10) for k in range(11)]
    assert res.n_episodes == len(store.get_evaluation(res.evaluation).results) == 10
    assert res.mean == pytest.approx(0.6)


def test_coevo_eval_on_a_terminal_draws_the_count(eval_db, bar_events, monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(coevo.cli, "console", terminal_console(buf))
    r = runner.invoke(app, eval_args(eval_db))
    assert r.exit_code == 0, r.output
    phase = f"eval {ENV} val"
    assert bar_events == [(phase, k, 5) for k in range(6)]
    shown = buf.getvalue()
    assert f"{phase} " in shown and " 5/5 " in shown and "━" in shown  # the finished bar
    assert "0.600 [" in shown  # then the result table


def test_coevo_eval_in_a_pipe_has_no_bar_and_json_is_the_stored_summary(eval_db, bar_events):
    r = runner.invoke(app, eval_args(eval_db))
    assert r.exit_code == 0, r.output
    assert len(bar_events) == 6  # counted, not drawn
    assert "\x1b" not in r.output and "━" not in r.output and "5/5" not in r.output
    header, row = r.output.splitlines()
    assert header.split("\t")[:2] == ["mean [95% CI]", "success"] and row.startswith("0.600 [")
    r = runner.invoke(app, [*eval_args(eval_db, n=4), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    stored = Store.open(eval_db).get_evaluation(doc["evaluation"])
    assert {k: v for k, v in doc.items() if k != "tasks"} == stored.summary
    assert [(t["task_id"], t["outcome"]) for t in doc["tasks"]] == [
        (r.task_id, r.outcome) for r in stored.results] == [
        ("val-0", 1.0), ("val-1", 0.0), ("val-2", 1.0), ("val-3", 0.0)]
    assert "\x1b" not in r.output


def by_phase(events):
    out: dict[str, list[tuple[int, int]]] = {}
    for phase, done, total in events:
        out.setdefault(phase, []).append((done, total))
    return out


def test_the_loop_counts_rl_steps_evaluations_and_gate_episodes(tmp_path):
    from test_loop import build, config

    cfg = config(tmp_path)  # gated, one round: HELPS is accepted, NO_EFFECT rejected
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'l.db'}")
    events = []
    res = run_coevolution(cfg, store, parts, on_count=lambda *e: events.append(e))
    seen = by_phase(events)
    assert list(seen) == ["round 0: val start", "round 0: RL steps", "round 0: gate 1/2",
                          "round 0: gate 2/2", "round 0: val", "final: test"]
    for phase, counts in seen.items():
        assert counts[0][0] == 0 and [d for d, _ in counts] == sorted(d for d, _ in counts), phase
    assert seen["round 0: RL steps"] == [(0, 1), (1, 1), (1, 1)]  # start, the step, the end
    assert seen["final: test"] == [(k, 6) for k in range(7)]
    # candidate 1: both arms on 12 val tasks; candidate 2: its own arm (the incumbent's cached)
    assert (seen["round 0: gate 1/2"][0], seen["round 0: gate 1/2"][-1]) == ((0, 24), (24, 24))
    assert (seen["round 0: gate 2/2"][0], seen["round 0: gate 2/2"][-1]) == ((0, 12), (12, 12))
    ended = sum(seen[p][-1][0] for p in seen if p.startswith("round 0: val") or "gate" in p)
    assert ended == len(store.trajectories(res.run, round=0, split="val")) == 12 + 24 + 12 + 12


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_coevo_run_shows_phases_on_a_terminal_only(tmp_path, monkeypatch, terminal):
    from test_loop import build, config

    cfg = config(tmp_path, "harness-only")
    db = f"sqlite:///{tmp_path / 'r.db'}"
    store, parts = build(tmp_path, cfg, db)
    monkeypatch.setattr(coevo.loop, "build_parts", lambda _: parts)  # the scripted policy
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    buf = io.StringIO()
    if terminal:
        monkeypatch.setattr(coevo.cli, "console", terminal_console(buf))
    r = runner.invoke(app, ["run", str(path), "--db", db])
    assert r.exit_code == 0, r.output
    shown = buf.getvalue() if terminal else r.output
    assert "val after: 1.000" in shown and "test:" in shown  # the loop's lines, either way
    bars = [line for line in shown.splitlines() if "━" in line]
    if terminal:
        finished = {p: line for line in bars for p in ("train rollouts", "gate 1/2", "final: test")
                    if p in line and "eta" not in line.split(p)[0]}
        assert cfg.splits.train_n * cfg.splits.train_samples == 8
        assert " 8/8 " in finished["train rollouts"] and " 24/24 " in finished["gate 1/2"]
        assert " 6/6 " in finished["final: test"]
    else:
        assert bars == [] and "\x1b" not in shown
