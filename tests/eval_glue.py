"""`coevo eval` end to end with a scripted model: the path the environment adapters' tests share
(a tool-calling harness stored directly, the CLI, the stored trajectories)."""

from __future__ import annotations

from typer.testing import CliRunner

from coevo.assets.harness import Harness, Workflow
from coevo.cli import app
from coevo.models.registry import BACKENDS
from coevo.models.scripted import ScriptedBackend
from coevo.store import Store

ALL_VAL = '{"fractions":{"val":1.0}}'  # a spec's ?split=: every task in val


def scripted_eval(tmp_path, monkeypatch, script, env: str, max_turns: int = 3):
    """(printed output, stored val trajectories) of `coevo eval` on `env`, the model replaying
    `script(request, index)` and the harness writing JSON tool calls."""
    monkeypatch.setitem(BACKENDS._items, "scripted", lambda arg, **o: ScriptedBackend(script))
    db = f"sqlite:///{tmp_path / 'eval.db'}"
    Store.open(db).put_asset(Harness(name="tools", system_prompt="Use the tools.",
                                     tool_format="json", workflow=Workflow(max_turns=max_turns)))
    r = CliRunner().invoke(app, ["eval", "--harness", "tools", "--env", env, "--split", "val",
                                 "--model", "scripted", "--db", db])
    assert r.exit_code == 0, r.output
    return r.output, Store.open(db).trajectories(split="val")
