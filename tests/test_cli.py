"""The CLI through typer's runner: init imports seeds, versions resolve by name / hash / prefix,
bad input exits non-zero with a one-line error and writes nothing."""

from __future__ import annotations

import re
import shutil

import typer
from typer.testing import CliRunner

from coevo.assets import Harness, load_asset
from coevo.cli import app
from coevo.store import Store
from conftest import REPO

runner = CliRunner()


def _seed_copy(tmp_path):
    root = tmp_path / "seed"
    for d in ("harnesses", "skills", "rubrics"):
        shutil.copytree(REPO / d, root / d)
    return root


def test_init_imports_every_seed_asset_once(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = runner.invoke(app, ["init", "--assets", str(REPO), "--db", db])
    assert r.exit_code == 0, r.output
    store = Store.open(db)
    kinds = sorted({a.kind for a in store.list_assets()})
    assert kinds == ["harness", "rubric", "skill", "skill_library"]
    n = len(store.list_assets())
    # Importing again stores nothing new: versions are unique by content.
    r = runner.invoke(app, ["init", "--assets", str(REPO), "--db", db])
    assert r.exit_code == 0 and "new" not in r.output.split("status")[-1]
    assert len(store.list_assets()) == n


def test_show_diff_export_by_name_hash_and_prefix(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    assert runner.invoke(app, ["init", "--assets", str(REPO), "--db", db]).exit_code == 0
    store = Store.open(db)
    base = store.get_asset("harness", "function_calling")
    child = base.child(system_prompt=base.system_prompt + "\nAlways answer with one call.")
    store.put_asset(child)

    # The name resolves to the latest version; a prefix resolves uniquely.
    shown = runner.invoke(app, ["harness", "show", "function_calling", "--db", db])
    assert shown.exit_code == 0 and child.hash in shown.output
    shown = runner.invoke(app, ["harness", "show", base.hash[:10], "--db", db])
    assert shown.exit_code == 0 and base.hash in shown.output

    d = runner.invoke(app, ["harness", "diff", base.hash, child.hash, "--db", db])
    assert d.exit_code == 0
    assert "+Always answer with one call." in d.output
    assert "system_prompt" in d.output and "demos" not in d.output

    out = tmp_path / "exported" / "harnesses" / "x.yaml"
    e = runner.invoke(app, ["harness", "export", child.hash[:8], "--out", str(out), "--db", db])
    assert e.exit_code == 0, e.output
    back = load_asset(out)
    assert isinstance(back, Harness) and back.hash == child.hash

    listed = runner.invoke(app, ["harness", "list", "--db", db])
    assert child.hash[:12] in listed.output and base.hash[:12] in listed.output


def test_unknown_reference_is_one_line_error(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    runner.invoke(app, ["init", "--assets", str(REPO), "--db", db])
    r = runner.invoke(app, ["rubrics", "show", "no-such-rubric", "--db", db])
    assert r.exit_code == 1
    assert "no-such-rubric" in r.output and "Traceback" not in r.output


def test_bad_seed_file_names_file_and_field_and_stores_nothing(tmp_path):
    root = _seed_copy(tmp_path)
    bad = root / "harnesses" / "function_calling.yaml"
    bad.write_text(bad.read_text().replace("tool_format:", "tool_fromat:"))
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = runner.invoke(app, ["init", "--assets", str(root), "--db", db])
    assert r.exit_code == 1
    assert "function_calling.yaml" in r.output and "tool_fromat" in r.output
    assert Store.open(db).list_assets() == []


def test_skills_and_db_commands(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    runner.invoke(app, ["init", "--assets", str(REPO), "--db", db])
    r = runner.invoke(app, ["skills", "show", "function-call-format", "--db", db])
    assert r.exit_code == 0 and "name: function-call-format" in r.output
    r = runner.invoke(app, ["db", "current", "--db", db])
    store = Store.open(db)
    assert r.exit_code == 0 and f"current: {store.head_revision()}" in r.output


def test_audit_commands_show_reasons_lineage_and_report(tmp_path):
    from test_audit import populate

    db = f"sqlite:///{tmp_path / 'a.db'}"
    store = Store.open(db)
    sc = populate(store)
    r = runner.invoke(app, ["runs", "list", "--db", db])
    assert r.exit_code == 0 and "exp1" in r.output
    r = runner.invoke(app, ["proposals", "list", "--run", "exp1", "--status", "rejected", "--db", db])
    assert r.exit_code == 0 and "rejected" in r.output and "accepted" not in r.output
    pid = store.proposals(status="accepted")[0].id
    r = runner.invoke(app, ["proposals", "show", pid[:8], "--db", db])
    assert r.exit_code == 0 and "careful" in r.output  # the diff line of the accepted prompt
    r = runner.invoke(app, ["lineage", sc.h[1].hash[:10], "--db", db])
    assert r.exit_code == 0 and "this version" in r.output
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "exp1", "--out", str(out), "--db", db])
    assert r.exit_code == 0 and out.exists() and "<svg" in out.read_text()


def test_get_library_returns_the_member_skill_versions(tmp_path):
    from coevo.cli import load_agent_assets

    db = f"sqlite:///{tmp_path / 'c.db'}"
    runner.invoke(app, ["init", "--assets", str(REPO), "--db", db])
    store = Store.open(db)
    lib, skills = store.get_library("seed")
    assert sorted(s.name for s in skills) == sorted(lib.names)
    assert {s.hash for s in skills} == {m.hash for m in lib.skills}
    assets = load_agent_assets(store, "function_calling", None, None)
    assert assets.library.hash == lib.hash and assets.rubric.name == "function_calling"


def _commands(cmd, path=()):
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_bracketed_words_in_option_help_survive_rich_markup():
    """Rich reads `[word]` as a style tag and drops it: `coevo[trackio]` was shown as `coevo`."""
    checked = 0
    for path, cmd in _commands(typer.main.get_command(app)):
        texts = [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]
        words = {w for t in texts for w in re.findall(r"\S*\[[a-z_]+\]\S*", t)}
        if not words:
            continue
        out = " ".join(runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output.split())
        for w in words:
            assert w.replace("\\[", "[") in out, (path, w)
            checked += 1
    assert checked >= 6  # --track on eval, run and train, each naming two extras


def test_every_command_s_help_is_whole_sentences_shown_in_full():
    """The top-level help was the module docstring's first line, cut mid-sentence."""
    for path, cmd in _commands(typer.main.get_command(app)):
        first = " ".join((cmd.help or "").split("\n\n")[0].split())
        assert first.endswith("."), (path, first)
        out = " ".join(runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output.split())
        assert first.replace("\\[", "[") in out, (path, first)
