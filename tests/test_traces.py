"""`coevo traces import`: production traces stored as imported trajectories, shown to the
proposers next to the round's own episodes, and never trained on, gated or evaluated."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coevo.cli import app
from coevo.errors import CoevoError
from coevo.propose.digest import digest
from coevo.rl.batch import TrajectoryError, to_sample
from coevo.store import Store
from coevo.traces import IMPORTED, import_traces, imported_traces, read_traces
from test_loop import HELPS, NO_EFFECT, build, config

runner = CliRunner()

TOOLS = [{"type": "function", "function": {"name": "cancel_booking", "parameters": {
    "type": "object", "properties": {"reference": {"type": "string"}}}}}]
TRACES = [
    {"id": "t1", "messages": [
        {"role": "system", "content": "Their own prompt."},
        {"role": "user", "content": "Cancel AB12"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "cancel_booking", "arguments": "{\"reference\": \"AB21\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cancelled AB21"},
        {"role": "assistant", "content": "Done."}],
     "tools": TOOLS, "outcome": 0.0, "feedback": "cancelled the wrong booking: AB21 instead of AB12"},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
     "outcome": 1.0},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Refund?"}]},
                  {"role": "assistant", "content": "No."}], "feedback": "rude"},
]


def write(path, lines):
    path.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n")
    return path


def test_cli_import_stores_imported_untrainable_traces_once(tmp_path):
    f = write(tmp_path / "prod.jsonl", TRACES)
    db = f"sqlite:///{tmp_path / 'c.db'}"
    tasks = write(tmp_path / "tasks.jsonl", [{"prompt": "x", "answer": "y"}])
    env = f"jsonl:{tasks}"
    r = runner.invoke(app, ["traces", "import", str(f), "--env", env, "--db", db])
    assert r.exit_code == 0, r.output
    assert "3 traces imported" in r.output and "(0 already stored)" in r.output
    store = Store.open(db)
    got = store.trajectories(split=IMPORTED)
    assert [t.task_id for t in got][0] == "t1" and len(got) == 3
    t1 = got[0]
    assert (t1.env, t1.outcome, t1.success, t1.trainable, t1.answer) == (env, 0.0, False, False, "Done.")
    assert t1.messages[0]["role"] == "tools" and json.loads(t1.messages[0]["content"]) == TOOLS
    assert t1.messages[-1] == {"role": "feedback", "content": TRACES[0]["feedback"]}
    assert t1.messages[3]["tool_calls"][0]["function"]["name"] == "cancel_booking"
    assert got[1].success and got[2].outcome is None and got[2].messages[0]["content"] == "Refund?"
    r = runner.invoke(app, ["traces", "import", str(f), "--env", env, "--db", db])
    assert "0 traces imported" in r.output and "(3 already stored)" in r.output
    assert len(store.trajectories(split=IMPORTED)) == 3


@pytest.mark.parametrize("line, field", [
    ({"messages": [{"role": "user", "content": "x"}], "outcome": 1.5}, "outcome"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "x"}], "score": 1}, "score"),
    ({"id": "t1", "messages": [{"role": "user", "content": "x"}]}, "id"),
])
def test_a_bad_line_names_file_line_and_field_and_stores_nothing(tmp_path, line, field):
    f = write(tmp_path / "prod.jsonl", [TRACES[0], line])
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = runner.invoke(app, ["traces", "import", str(f), "--env", "rg:basic_arithmetic", "--db", db])
    assert r.exit_code == 1 and f"prod.jsonl:2: {field}:" in r.output, r.output
    assert Store.open(db).trajectories(split=IMPORTED) == []


def test_imported_traces_are_never_trainable_nor_tied_to_a_run(tmp_path):
    f = write(tmp_path / "prod.jsonl", TRACES)
    t = read_traces(f, "e")[0]
    with pytest.raises(TrajectoryError, match="split: is 'imported'"):
        to_sample(t, 1.0)
    store = Store.open(f"sqlite:///{tmp_path / 'c.db'}")
    run = store.create_run("r", config={}, mode="gated")
    with pytest.raises(CoevoError, match="belongs to no run"):
        store.add_trajectories([t], run=run.id, round=0)
    with pytest.raises(CoevoError, match="never trainable"):
        store.add_trajectories([t.model_copy(update={"trainable": True})])


def test_the_digest_shows_imported_traces_worst_first_with_feedback(tmp_path):
    trs = read_traces(write(tmp_path / "prod.jsonl", TRACES), "e")
    text = digest([], imported=trs, n_imported=2).text()
    assert "IMPORTED TRACES" in text and "<<<IMPORTED TRACE 1 task=t1 outcome=0.00>>>" in text
    assert "[feedback] cancelled the wrong booking" in text and "Their own prompt" not in text
    assert "outcome=1.00" not in text  # the success ranks last and n_imported=2 leaves it out
    assert "IMPORTED" not in digest([], imported=[]).text()


def test_the_loop_gives_imported_traces_to_proposers_only(tmp_path):
    cfg = config(tmp_path, "gated", (HELPS, NO_EFFECT))
    store, parts = build(tmp_path, cfg, f"sqlite:///{tmp_path / 'loop.db'}")
    import_traces(store, write(tmp_path / "prod.jsonl", TRACES), parts.env.name)
    import_traces(store, write(tmp_path / "other.jsonl", [TRACES[1]]), "another-env")
    seen = []

    class Recording:
        name = "scripted"

        def __init__(self, inner):
            self.inner = inner

        def propose(self, ctx):
            seen.append(ctx)
            return self.inner.propose(ctx)

    parts.proposers[:] = [Recording(p) for p in parts.proposers]
    from coevo.loop import run_coevolution

    res = run_coevolution(cfg, store, parts)
    imported = {t.id for t in imported_traces(store, parts.env.name)}
    assert len(imported) == 3
    assert [{t.id for t in ctx.imported} for ctx in seen] == [imported]
    assert not imported & {t.id for t in seen[0].trajectories}
    # the RL stage's rollouts, the gate's and the evaluations' episodes: none imported
    run_trajs = store.trajectories(res.run)
    assert run_trajs and IMPORTED not in {t.split for t in run_trajs}
    ids = {t.task_id for t in store.trajectories(split=IMPORTED)}
    evidence = {e.task_id for p in store.proposals(res.run) for d in store.decisions(p.id)
                for e in d.evidence}
    assert evidence and not evidence & ids
    assert res.final is not None and res.final.mean == 1.0


def test_llm_proposers_read_imported_traces_in_their_digest(tmp_path):
    from pathlib import Path

    from coevo.propose import make_proposer
    from test_propose_harness import tool_context

    cassettes = Path(__file__).resolve().parent / "cassettes"
    ctx = tool_context()
    with_imported = ctx.model_copy(update={"imported": read_traces(write(tmp_path / "p.jsonl", TRACES), "e")})
    for name, tape in (("harness", "harness_tools.jsonl"), ("rubrics", "rubrics_fix.jsonl")):
        p = make_proposer(name, cassette=str(cassettes / tape), mode="replay")
        before, after = p.inputs(ctx)["round_digest"], p.inputs(with_imported)["round_digest"]
        assert "IMPORTED" not in before
        assert "IMPORTED TRACES" in after and "[feedback] cancelled the wrong booking" in after
        assert after.startswith(before.split("<<<TRAJECTORY 1")[0])  # same statistics first
