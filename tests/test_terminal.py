"""Model-written text printed by the CLI is shown, never obeyed: a proposal whose rationale,
raw output, error, prompt, diff, decision reason and evidence carry a screen clear, an OSC-8
link, a one-byte CSI, a bidi override and rich markup prints them as visible escapes and
literal brackets, on a plain pipe and on a colour terminal alike (coevo/terminal.py)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

import coevo.cli
import coevo.oneline
from coevo.assets.harness import Harness
from coevo.cli import app
from coevo.store import Store
from coevo.terminal import escaped, plain, safe

CLEAR = "\x1b[2J"
LINK = "\x1b]8;;http://evil.example/\x1b\\click here\x1b]8;;\x1b\\"
MARKUP = "[bold red]"
CSI8 = "\x9b31m"
BIDI = "\u202e"
HOSTILE = f"before {CLEAR} {LINK} {MARKUP}alarm{MARKUP} {CSI8} {BIDI}txt\rover\x08 after"
runner = CliRunner()


@pytest.fixture
def hostile_db(tmp_path):
    db = f"sqlite:///{tmp_path / 'a.db'}"
    store = Store.open(db)
    h0 = Harness(name="base", system_prompt="Be brief.")
    h1 = h0.child(system_prompt=f"Be brief. {HOSTILE}")
    store.put_asset(h0)
    run = store.create_run("exp", config={})
    store.start_round(run.id, 0)
    pid = store.add_proposal(proposer="harness", kind="harness", parent=h0.hash, candidate=h1,
                             run=run.id, round=0, rationale=f"rationale {HOSTILE}",
                             predicted_effect=f"effect {HOSTILE}", prompt=f"prompt {HOSTILE}",
                             raw_output=f"raw {HOSTILE}", error=f"error {HOSTILE}")
    store.add_decision(pid, policy="paired", accepted=False, reason=f"reason {HOSTILE}",
                       statistic={"note": f"stat {HOSTILE}"}, rollouts=2,
                       evidence=[{"task_id": f"task {HOSTILE}", "incumbent": 0.0, "candidate": 1.0}])
    return db, pid, h0, h1


VISIBLE = ("before \\x1b[2J \\x1b]8;;http://evil.example/\\x1b\\click here\\x1b]8;;\\x1b\\ "
           "[bold red]alarm[bold red] \\x9b31m \\u202etxt")


def assert_shown_not_obeyed(out: str, colour: bool = False) -> None:
    for raw in (CLEAR, "\x1b]8", CSI8, BIDI, "\r", "\x08"):
        assert raw not in out
    if not colour:  # rich writes no sequences of its own to a pipe
        assert "\x1b" not in out
    assert VISIBLE in out  # escapes shown, markup shown as brackets, nothing applied


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """The CLI's consoles, wide enough that no cell wraps the strings looked for."""
    monkeypatch.setattr(coevo.cli, "console", Console(width=400))
    monkeypatch.setattr(coevo.oneline, "err", Console(width=400, stderr=True))


@pytest.mark.parametrize("cmd", [["proposals", "show", "{pid}", "--prompt"],
                                 ["proposals", "list"], ["harness", "diff", "{h0}", "{h1}"],
                                 ["lineage", "{h1}"]],
                         ids=lambda c: " ".join(c[:2]))
def test_cli_prints_model_text_as_visible_escapes(hostile_db, cmd):
    db, pid, h0, h1 = hostile_db
    args = [a.format(pid=pid[:8], h0=h0.hash[:12], h1=h1.hash[:12]) for a in cmd] + ["--db", db]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    if cmd[0] == "lineage":  # names and proposers only (config, still escaped)
        assert "\x1b" not in r.output and "by harness" in r.output
        return
    assert_shown_not_obeyed(r.output)
    if cmd[1] == "show":
        for word in ("rationale", "effect", "prompt", "raw", "error", "reason", "task", "stat"):
            assert f"{word} {VISIBLE}" in r.output, word
        assert "\\x0dover\\x08 after" in r.output  # CR and backspace cannot overwrite


def test_harness_show_leaves_nothing_raw(hostile_db):
    db, _, _, h1 = hostile_db
    r = runner.invoke(app, ["harness", "show", h1.hash[:12], "--db", db])
    assert r.exit_code == 0
    # YAML already writes ESC and C1 as escapes ("\e", "\x9B"); the bidi override, which YAML
    # counts as printable, is escaped on top
    assert "\\e[2J" in r.output and "\\x9B31m" in r.output and "\\u202etxt" in r.output
    for raw in ("\x1b", CSI8, BIDI):
        assert raw not in r.output


def test_on_a_colour_terminal_too(hostile_db, monkeypatch):
    db, pid, *_ = hostile_db
    buf = io.StringIO()
    monkeypatch.setattr(coevo.cli, "console", Console(file=buf, force_terminal=True,
                                                      color_system="truecolor", width=300))
    r = runner.invoke(app, ["proposals", "show", pid[:8], "--db", db])
    assert r.exit_code == 0
    out = buf.getvalue()
    assert "\x1b[" in out  # rich's own colours are there ...
    assert_shown_not_obeyed(out, colour=True)  # ... the model's sequences are not


def test_errors_quoting_input_are_escaped_too(hostile_db):
    db, *_ = hostile_db
    r = runner.invoke(app, ["harness", "show", f"x{CLEAR}{MARKUP}y", "--db", db])
    assert r.exit_code == 1
    assert CLEAR not in r.output and "x\\x1b[2J[bold red]y" in r.output


def test_helpers():
    assert safe("a\tb\nc\x1b\x7f\x85\u2066") == "a\tb\nc\\x1b\\x7f\\x85\\u2066"
    assert escaped("[link=http://x]y[/link]") == "\\[link=http://x]y\\[/link]"
    assert plain(f"{MARKUP}{CLEAR}").plain == "[bold red]\\x1b[2J"
