"""Every malformed input a careless or hostile user might give the CLI: command-line flags, store
URLs and paths, run configs and asset files. Each must exit non-zero with exactly one line that
names what is wrong (the flag, field, file or URL), no traceback, an unchanged store and no file
left behind. Ids read as the input (`eval-n-negative`)."""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml
from typer.testing import CliRunner

from coevo.cli import app
from conftest import REPO

runner = CliRunner()
OPENAI = "openai:http://127.0.0.1:9/v1"  # nothing listens there; no case gets far enough to call it
EVAL = ["eval", "--harness", "reasoning", "--env", "rg:basic_arithmetic", "--model", OPENAI]
TRAIN = ["train", "--harness", "reasoning", "--env", "rg:basic_arithmetic"]


@dataclass
class Case:
    id: str
    argv: list[str]  # {db} {T} {seed} {cfg} are filled in
    expect: tuple[str, ...]  # each must appear in the one line printed
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)


# --- files the cases write ------------------------------------------------------------------------

BASE_CFG = {"name": "probe", "env": "rg:basic_arithmetic", "model": {"backend": OPENAI},
            "mode": "harness-only", "rounds": 1,
            "assets": {"harness": "reasoning", "rubric": "reasoning", "skill_library": "seed"}}


def cfg(**changes) -> Callable[[Path], None]:
    """A run config at {T}/cfg.yaml: BASE_CFG with dotted `changes` (None deletes the key)."""

    def write(t: Path) -> None:
        data = yaml.safe_load(yaml.safe_dump(BASE_CFG))
        for key, value in changes.items():
            *path, last = key.split("__")
            node = data
            for p in path:
                node = node.setdefault(p, {})
            if value is None:
                node.pop(last, None)
            else:
                node[last] = value
        (t / "cfg.yaml").write_text(yaml.safe_dump(data))

    return write


def raw_cfg(text: str | bytes) -> Callable[[Path], None]:
    def write(t: Path) -> None:
        p = t / "cfg.yaml"
        p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)

    return write


def seed_edit(rel: str, edit: Callable[[str], str] | str | bytes | None) -> Callable[[Path], None]:
    """Change one file of the seed copy at {seed}: a function of its text, new text or bytes,
    or None to delete it."""

    def write(t: Path) -> None:
        p = t / "seed" / rel
        if edit is None:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(edit, bytes):
            p.write_bytes(edit)
        else:
            p.write_text(edit if isinstance(edit, str) else edit(p.read_text()))

    return write


def foreign_sqlite(name: str = "other.db") -> Callable[[Path], None]:
    def write(t: Path) -> None:
        con = sqlite3.connect(t / name)
        con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        con.execute("INSERT INTO notes (body) VALUES ('keep me')")
        con.commit()
        con.close()

    return write


def plain_file(name: str, text: str = "not a database\n") -> Callable[[Path], None]:
    return lambda t: (t / name).write_text(text)


def both(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    def write(t: Path) -> None:
        for fn in fns:
            fn(t)

    return write


H = "harnesses/reasoning.yaml"
R = "rubrics/reasoning.yaml"
S = "skills/arithmetic-checking/SKILL.md"
INIT = ["init", "--assets", "{seed}", "--db", "{db}"]
RUN = ["run", "{cfg}", "--db", "{db}"]
BIG = 10 * 1024 * 1024


def _sub(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return edit


CASES = [
    # --- store URLs and paths -------------------------------------------------------------
    Case("db-empty", ["harness", "list", "--db", ""], ("--db",)),
    Case("db-memory", ["init", "--assets", "{seed}", "--db", ":memory:"], (":memory:",)),
    Case("db-path-uncreatable", ["init", "--assets", "{seed}", "--db", "/proc/coevo/x.db"], ("/proc/coevo",)),
    Case("db-path-parent-is-file", INIT[:3] + ["--db", "{T}/afile/x.db"], ("afile",), plain_file("afile")),
    Case("db-path-is-folder", INIT[:3] + ["--db", "{T}/folder"], ("folder",),
         lambda t: (t / "folder").mkdir()),
    Case("db-foreign-sqlite", INIT[:3] + ["--db", "{T}/other.db"], ("other.db", "coevo"), foreign_sqlite()),
    Case("db-foreign-sqlite-list", ["runs", "list", "--db", "{T}/other.db"], ("other.db",), foreign_sqlite()),
    Case("db-foreign-sqlite-upgrade", ["db", "upgrade", "--db", "{T}/other.db"], ("other.db",), foreign_sqlite()),
    Case("db-not-a-database", INIT[:3] + ["--db", "{T}/text.db"], ("text.db",), plain_file("text.db")),
    Case("db-unknown-scheme", ["harness", "list", "--db", "nosuchdb://x/y"], ("nosuchdb",)),
    Case("db-mysql-scheme", ["harness", "list", "--db", "mysql://u@localhost/x"], ("mysql",)),
    Case("db-pg-port-not-numeric", ["harness", "list", "--db", "postgresql://u@localhost:abc/db"], ("port",)),
    Case("db-pg-refused", ["harness", "list", "--db", "postgresql://u@127.0.0.1:9/db"], ("127.0.0.1",)),
    Case("db-url-unknown-query", ["harness", "list", "--db", "sqlite:///{T}/store.db?foo=bar"], ("foo",)),
    Case("db-pg-unknown-query", ["harness", "list", "--db", "postgresql://u@localhost/db?colour=red"], ("colour",)),
    Case("db-sqlite-url-no-path", ["harness", "list", "--db", "sqlite://"], ("sqlite://",)),
    Case("db-readonly-init", ["init", "--assets", "{seed}", "--db", "sqlite:///file:{T}/store.db?mode=ro&uri=true"],
         ("read-only",), lambda t: (t / "seed" / "harnesses" / "extra.yaml").write_text(
             "name: extra\nsystem_prompt: A new version to store.\n")),
    Case("db-readonly-train", TRAIN + ["--db", "sqlite:///file:{T}/store.db?mode=ro&uri=true"], ("read-only",)),
    Case("db-readonly-run", ["run", "{cfg}", "--db", "sqlite:///file:{T}/store.db?mode=ro&uri=true"],
         ("read-only",), cfg()),
    Case("env-coevo-db-unknown-scheme", ["harness", "list"], ("COEVO_DB",), env={"COEVO_DB": "nosuchdb://x"}),
    Case("serve-missing-store", ["serve", "--db", "{T}/missing.db"], ("missing.db",)),
    # --- init and seed folders ------------------------------------------------------------
    Case("init-assets-missing", ["init", "--assets", "{T}/nope", "--db", "{db}"], ("nope",)),
    Case("init-assets-is-file", ["init", "--assets", "{T}/afile", "--db", "{db}"], ("afile",), plain_file("afile")),
    Case("init-assets-without-harnesses", INIT, ("harnesses",), seed_edit("harnesses", None)),
    Case("init-assets-empty-folder", ["init", "--assets", "{T}/empty", "--db", "{db}"], ("harnesses",),
         lambda t: (t / "empty").mkdir()),
    # --- harness files ----------------------------------------------------------------------
    Case("harness-unknown-key", INIT, ("reasoning.yaml", "system_promt"),
         seed_edit(H, _sub("system_prompt:", "system_promt:"))),
    Case("harness-yaml-syntax", INIT, ("reasoning.yaml", "YAML"), seed_edit(H, lambda s: s + "\nbad: [unclosed\n")),
    Case("harness-not-mapping", INIT, ("reasoning.yaml",), seed_edit(H, "- a\n- b\n")),
    Case("harness-empty-file", INIT, ("reasoning.yaml",), seed_edit(H, "")),
    Case("harness-duplicate-key", INIT, ("reasoning.yaml", "name"), seed_edit(H, lambda s: s + "\nname: again\n")),
    Case("harness-not-utf8", INIT, ("reasoning.yaml", "UTF-8"), seed_edit(H, b"name: \xff\xfe\n")),
    Case("harness-name-bad-chars", INIT, ("reasoning.yaml", "name"), seed_edit(H, _sub("name: reasoning", "name: 'a b/c'"))),
    Case("harness-name-too-long", INIT, ("reasoning.yaml", "name"), seed_edit(H, _sub("name: reasoning", "name: " + "a" * 65))),
    Case("harness-system-prompt-missing", INIT, ("reasoning.yaml", "system_prompt"),
         seed_edit(H, lambda s: yaml.safe_dump({k: v for k, v in yaml.safe_load(s).items() if k != "system_prompt"}))),
    Case("harness-system-prompt-huge", INIT, ("reasoning.yaml", "system_prompt"),
         seed_edit(H, lambda s: yaml.safe_dump({**yaml.safe_load(s), "system_prompt": "x" * BIG}))),
    Case("harness-description-huge", INIT, ("reasoning.yaml", "description"),
         seed_edit(H, lambda s: yaml.safe_dump({**yaml.safe_load(s), "description": "x" * BIG}))),
    Case("harness-demo-content-huge", INIT, ("reasoning.yaml", "demos"),
         seed_edit(H, lambda s: yaml.safe_dump({**yaml.safe_load(s), "demos": [
             {"messages": [{"role": "user", "content": "x" * BIG}]}]}))),
    Case("harness-max-turns-zero", INIT, ("reasoning.yaml", "max_turns"), seed_edit(H, _sub("max_turns: 1", "max_turns: 0"))),
    Case("harness-max-turns-text", INIT, ("reasoning.yaml", "max_turns"), seed_edit(H, _sub("max_turns: 1", "max_turns: many"))),
    Case("harness-extraction-method-unknown", INIT, ("reasoning.yaml", "method"), seed_edit(H, _sub("method: regex", "method: psychic"))),
    Case("harness-extraction-regex-invalid", INIT, ("reasoning.yaml", "pattern"),
         seed_edit(H, _sub("pattern: '(?im)^\\s*answer\\s*:\\s*(.+?)\\s*$'", "pattern: '(unclosed'"))),
    Case("harness-temperature-negative", INIT, ("reasoning.yaml", "temperature"),
         seed_edit(H, _sub("temperature: 0.7", "temperature: -1"))),
    Case("harness-top-p-above-one", INIT, ("reasoning.yaml", "top_p"), seed_edit(H, _sub("top_p: 0.95", "top_p: 2"))),
    Case("harness-max-new-tokens-zero", INIT, ("reasoning.yaml", "max_new_tokens"),
         seed_edit(H, _sub("max_new_tokens: 160", "max_new_tokens: 0"))),
    Case("harness-demo-role-unknown", INIT, ("reasoning.yaml", "role"), seed_edit(H, _sub("role: user", "role: wizard"))),
    Case("harness-skills-method-unknown", INIT, ("reasoning.yaml", "method"), seed_edit(H, _sub("method: bm25", "method: tarot"))),
    Case("harness-skills-top-k-negative", INIT, ("reasoning.yaml", "top_k"), seed_edit(H, _sub("top_k: 1", "top_k: -1"))),
    Case("harness-two-files-same-name", INIT, ("harnesses", "reasoning"),
         seed_edit("harnesses/copy.yaml", (REPO / H).read_text())),
    Case("harness-file-is-folder", INIT, ("x.yaml", "folder"), lambda t: (t / "seed/harnesses/x.yaml").mkdir()),
    # --- skill files (SKILL.md) -------------------------------------------------------------
    Case("skill-body-10mb", INIT, ("SKILL.md", "body"), seed_edit(S, lambda s: s + "\n" + "x" * BIG)),
    Case("skill-no-frontmatter", INIT, ("SKILL.md",), seed_edit(S, "# just a heading\n")),
    Case("skill-unclosed-frontmatter", INIT, ("SKILL.md",), seed_edit(S, "---\nname: a\n")),
    Case("skill-description-missing", INIT, ("SKILL.md", "description"),
         seed_edit(S, "---\nname: arithmetic-checking\n---\nbody\n")),
    Case("skill-description-huge", INIT, ("SKILL.md", "description"),
         seed_edit(S, "---\nname: arithmetic-checking\ndescription: " + "x" * BIG + "\n---\nbody\n")),
    Case("skill-name-uppercase", INIT, ("SKILL.md", "name"), seed_edit(S, _sub("name: arithmetic-checking", "name: Arithmetic"))),
    Case("skill-unknown-key", INIT, ("SKILL.md", "colour"), seed_edit(S, _sub("state: active", "state: active\ncolour: red"))),
    Case("skill-state-unknown", INIT, ("SKILL.md", "state"), seed_edit(S, _sub("state: active", "state: asleep"))),
    Case("skill-targets-not-list", INIT, ("SKILL.md", "targets"),
         seed_edit(S, "---\nname: arithmetic-checking\ndescription: d\ntargets: {a: 1}\n---\nbody\n")),
    Case("skill-frontmatter-yaml-syntax", INIT, ("SKILL.md",), seed_edit(S, "---\nname: [x\n---\nbody\n")),
    Case("skill-compatibility-huge", INIT, ("SKILL.md", "compatibility"),
         seed_edit(S, _sub("state: active", "state: active\ncompatibility: " + "x" * 600))),
    # --- rubric files -----------------------------------------------------------------------
    Case("rubric-unknown-key", INIT, ("reasoning.yaml", "outcome_weigth"), seed_edit(R, _sub("outcome_weight:", "outcome_weigth:"))),
    Case("rubric-criterion-kind-unknown", INIT, ("reasoning.yaml", "kind"), seed_edit(R, _sub("kind: regex", "kind: vibes"))),
    Case("rubric-regex-invalid", INIT, ("reasoning.yaml", "pattern"),
         seed_edit(R, _sub("pattern: '^-?\\d+(?:\\.\\d+)?$'", "pattern: '(unclosed'"))),
    Case("rubric-weight-text", INIT, ("reasoning.yaml", "weight"), seed_edit(R, _sub("weight: 2.0", "weight: heavy"))),
    Case("rubric-criterion-id-bad", INIT, ("reasoning.yaml", "id"), seed_edit(R, _sub("id: outcome", "id: 'out come!'"))),
    Case("rubric-criteria-not-list", INIT, ("reasoning.yaml", "criteria"),
         seed_edit(R, "name: reasoning\ncriteria: 3\n")),
    Case("rubric-yaml-syntax", INIT, ("reasoning.yaml",), seed_edit(R, "name: [reasoning\n")),
    Case("rubric-description-huge", INIT, ("reasoning.yaml", "description"),
         seed_edit(R, lambda s: yaml.safe_dump({**yaml.safe_load(s), "description": "x" * BIG}))),
    # --- run configs --------------------------------------------------------------------------
    Case("run-no-config", ["run", "--db", "{db}"], ("config",)),
    Case("run-config-missing", ["run", "{T}/nope.yaml", "--db", "{db}"], ("nope.yaml",)),
    Case("run-config-is-folder", ["run", "{T}", "--db", "{db}"], ("cannot read",)),
    Case("run-config-yaml-syntax", RUN, ("cfg.yaml", "YAML"), raw_cfg("name: [x\n")),
    Case("run-config-list", RUN, ("cfg.yaml", "mapping"), raw_cfg("- a\n- b\n")),
    Case("run-config-not-utf8", RUN, ("cfg.yaml",), raw_cfg(b"name: \xff\xfe\n")),
    Case("run-config-empty", RUN, ("cfg.yaml", "name"), raw_cfg("")),
    Case("run-unknown-key", RUN, ("cfg.yaml", "roundz"), cfg(roundz=3)),
    Case("run-name-missing", RUN, ("cfg.yaml", "name"), cfg(name=None)),
    Case("run-name-empty", RUN, ("cfg.yaml", "name"), cfg(name="")),
    Case("run-name-dotdot", RUN, ("cfg.yaml", "name"), cfg(name="../escape")),
    Case("run-name-slash", RUN, ("cfg.yaml", "name"), cfg(name="a/b")),
    Case("run-name-backslash", RUN, ("cfg.yaml", "name"), cfg(name="a\\b")),
    Case("run-name-dot", RUN, ("cfg.yaml", "name"), cfg(name=".")),
    Case("run-name-newline", RUN, ("cfg.yaml", "name"), cfg(name="a\nb")),
    Case("run-name-taken", RUN, ("r1", "exists"), cfg(name="r1")),
    Case("run-rounds-zero", RUN, ("cfg.yaml", "rounds"), cfg(rounds=0)),
    Case("run-rounds-text", RUN, ("cfg.yaml", "rounds"), cfg(rounds="many")),
    Case("run-mode-unknown", RUN, ("cfg.yaml", "mode"), cfg(mode="turbo")),
    Case("run-env-missing", RUN, ("cfg.yaml", "env"), cfg(env=None)),
    Case("run-env-unknown-kind", RUN, ("nosuch",), cfg(env="nosuch:thing")),
    Case("run-env-unknown-query", RUN, ("colour",), cfg(env="rg:basic_arithmetic?colour=red")),
    Case("run-assets-missing", RUN, ("cfg.yaml", "assets"), cfg(assets=None)),
    Case("run-assets-harness-unknown", RUN, ("no-such-harness",), cfg(assets__harness="no-such-harness")),
    Case("run-assets-seed-dir-missing", RUN, ("nope",), cfg(assets__seed_dir="/nonexistent/nope")),
    Case("run-model-options-unknown-key", RUN, ("model.options", "nope"), cfg(model={"backend": OPENAI, "options": {"nope": 1}})),
    Case("run-model-options-unknown-key-embedded", RUN, ("model.options", "colour"),
         cfg(mode="gated", model={"backend": "embedded", "options": {"colour": 1}})),
    Case("run-judge-options-unknown-key", RUN, ("judge.options", "nope"), cfg(judge={"backend": OPENAI, "options": {"nope": 1}})),
    Case("run-model-backend-unknown", RUN, ("nosuchkind",), cfg(model={"backend": "nosuchkind:x"})),
    Case("run-model-unknown-key", RUN, ("cfg.yaml", "model.colour"), cfg(model={"backend": OPENAI, "colour": 1})),
    Case("run-proposer-unknown", RUN, ("proposers", "nosuch"), cfg(proposers=[{"name": "nosuch"}])),
    Case("run-proposer-scripted-candidates-not-list", RUN, ("proposers", "scripted"),
         cfg(proposers=[{"name": "scripted", "options": {"candidates": 3}}])),
    Case("run-proposer-demos-bad-option", RUN, ("proposers", "demos"), cfg(proposers=[{"name": "demos", "options": {"colour": 1}}])),
    Case("run-proposers-not-list", RUN, ("cfg.yaml", "proposers"), cfg(proposers="demos")),
    Case("run-stage-checkpoint-dir-unwritable", RUN, ("rl.stage.checkpoint_dir",),
         cfg(mode="gated", model={"backend": "embedded"}, rl={"stage": {"checkpoint_dir": "/proc/coevo/ckpt"}})),
    Case("run-stage-checkpoint-dir-is-file", RUN, ("rl.stage.checkpoint_dir",),
         both(plain_file("afile"), cfg(mode="gated", model={"backend": "embedded"},
                                       rl={"stage": {"checkpoint_dir": "afile"}}))),
    Case("run-stage-steps-zero", RUN, ("cfg.yaml", "rl.stage.steps"), cfg(rl={"stage": {"steps": 0}})),
    Case("run-stage-samples-one", RUN, ("cfg.yaml", "rl.stage.samples"), cfg(rl={"stage": {"samples": 1}})),
    Case("run-train-lr-negative", RUN, ("cfg.yaml", "rl.train.lr"), cfg(rl={"train": {"lr": -1}})),
    Case("run-lora-rank-zero", RUN, ("cfg.yaml", "rl.train.lora.rank"), cfg(rl={"train": {"lora": {"rank": 0}}})),
    Case("run-gate-alpha-above-one", RUN, ("cfg.yaml", "gate.alpha"), cfg(gate={"alpha": 2})),
    Case("run-gate-unknown-key", RUN, ("cfg.yaml", "gate.alfa"), cfg(gate={"alfa": 0.1})),
    Case("run-splits-val-n-zero", RUN, ("cfg.yaml", "splits.val_n"), cfg(splits={"val_n": 0})),
    Case("run-budgets-seconds-negative", RUN, ("cfg.yaml", "budgets.seconds"), cfg(budgets={"seconds": -5})),
    Case("run-budgets-unknown-key", RUN, ("cfg.yaml", "budgets.rollout"), cfg(budgets={"rollout": 5})),
    Case("run-override-no-equals", RUN + ["rounds"], ("rounds", "key=value"), cfg()),
    Case("run-override-bad-yaml", RUN + ["rounds=[1"], ("rounds", "YAML"), cfg()),
    Case("run-override-unknown-key", RUN + ["gate.alfa=0.1"], ("gate.alfa",), cfg()),
    Case("run-override-into-scalar", RUN + ["rounds.x=1"], ("rounds",), cfg()),
    Case("run-override-empty-key", RUN + ["=3"], ("=3",), cfg()),
    Case("run-override-name-dotdot", RUN + ["name=../x"], ("name",), cfg()),
    Case("run-resume-unknown", ["run", "--resume", "nope", "--db", "{db}"], ("nope",)),
    Case("run-resume-changed-config", ["run", "{cfg}", "--resume", "r1", "--db", "{db}"], ("r1",), cfg(name="r1")),
    # --- eval ---------------------------------------------------------------------------------
    Case("eval-n-negative", EVAL + ["--n", "-1", "--db", "{db}"], ("--n",)),
    Case("eval-n-zero", EVAL + ["--n", "0", "--db", "{db}"], ("--n",)),
    Case("eval-n-text", EVAL + ["--n", "abc", "--db", "{db}"], ("--n",)),
    Case("eval-samples-zero", EVAL + ["--samples", "0", "--db", "{db}"], ("--samples",)),
    Case("eval-split-unknown", EVAL + ["--split", "holdout", "--db", "{db}"], ("--split", "holdout")),
    Case("eval-executor-unknown", EVAL + ["--executor", "cloud", "--db", "{db}"], ("--executor", "cloud")),
    Case("eval-harness-unknown", ["eval", "--harness", "nope", "--env", "rg:basic_arithmetic", "--db", "{db}"], ("nope",)),
    Case("eval-harness-missing", ["eval", "--env", "rg:basic_arithmetic", "--db", "{db}"], ("--harness",)),
    Case("eval-env-unknown-kind", ["eval", "--harness", "reasoning", "--env", "nosuch:x", "--model", OPENAI,
                                   "--db", "{db}"], ("nosuch",)),
    Case("eval-env-empty", ["eval", "--harness", "reasoning", "--env", "", "--model", OPENAI, "--db", "{db}"], ("--env",)),
    Case("eval-model-unknown-kind", ["eval", "--harness", "reasoning", "--env", "rg:basic_arithmetic",
                                     "--model", "nosuchkind:x", "--db", "{db}"], ("nosuchkind",)),
    Case("eval-rubric-unknown", EVAL + ["--rubric", "nope", "--db", "{db}"], ("nope",)),
    Case("eval-skills-unknown", EVAL + ["--skills", "nope", "--db", "{db}"], ("nope",)),
    Case("eval-unknown-flag", EVAL + ["--colour", "red", "--db", "{db}"], ("--colour",)),
    # --- train --------------------------------------------------------------------------------
    Case("train-steps-zero", TRAIN + ["--steps", "0", "--db", "{db}"], ("--steps",)),
    Case("train-group-size-one", TRAIN + ["--group-size", "1", "--db", "{db}"], ("--group-size",)),
    Case("train-tasks-per-step-zero", TRAIN + ["--tasks-per-step", "0", "--db", "{db}"], ("--tasks-per-step",)),
    Case("train-lr-negative", TRAIN + ["--lr", "-0.1", "--db", "{db}"], ("--lr",)),
    Case("train-lora-rank-zero", TRAIN + ["--lora-rank", "0", "--db", "{db}"], ("--lora-rank",)),
    Case("train-checkpoint-every-zero", TRAIN + ["--checkpoint-every", "0", "--db", "{db}"], ("--checkpoint-every",)),
    Case("train-warmup-negative", TRAIN + ["--warmup-steps", "-1", "--db", "{db}"], ("--warmup-steps",)),
    Case("train-actors-zero", TRAIN + ["--executor", "ray", "--actors", "0", "--db", "{db}"], ("--actors",)),
    Case("train-executor-unknown", TRAIN + ["--executor", "cloud", "--db", "{db}"], ("--executor", "cloud")),
    Case("train-run-dotdot", TRAIN + ["--run", "../escape", "--db", "{db}"], ("--run",)),
    Case("train-run-slash", TRAIN + ["--run", "a/b", "--db", "{db}"], ("--run",)),
    Case("train-run-empty", TRAIN + ["--run", "", "--db", "{db}"], ("--run",)),
    Case("train-run-taken", TRAIN + ["--run", "r1", "--db", "{db}"], ("r1",)),
    Case("train-resume-unknown", TRAIN + ["--run", "nope", "--resume", "--db", "{db}"], ("nope",)),
    Case("train-harness-unknown", ["train", "--harness", "nope", "--env", "rg:basic_arithmetic", "--db", "{db}"], ("nope",)),
    Case("train-steps-text", TRAIN + ["--steps", "ten", "--db", "{db}"], ("--steps",)),
    # --- versions, runs, proposals, reports ------------------------------------------------
    Case("harness-show-unknown", ["harness", "show", "nope", "--db", "{db}"], ("nope",)),
    Case("harness-show-empty-ref", ["harness", "show", "", "--db", "{db}"], ("harness",)),
    Case("harness-show-missing-ref", ["harness", "show", "--db", "{db}"], ("ref",)),
    Case("harness-diff-unknown", ["harness", "diff", "reasoning", "nope", "--db", "{db}"], ("nope",)),
    Case("harness-export-unknown", ["harness", "export", "nope", "--db", "{db}"], ("nope",)),
    Case("harness-export-out-unwritable", ["harness", "export", "reasoning", "--out", "/proc/coevo/h.yaml",
                                           "--db", "{db}"], ("/proc/coevo",)),
    Case("harness-export-out-is-folder", ["harness", "export", "reasoning", "--out", "{T}/folder", "--db", "{db}"],
         ("folder",), lambda t: (t / "folder").mkdir()),
    Case("harness-export-out-parent-is-file", ["harness", "export", "reasoning", "--out", "{T}/afile/h.yaml",
                                               "--db", "{db}"], ("afile",), plain_file("afile")),
    Case("skills-show-unknown", ["skills", "show", "nope", "--db", "{db}"], ("nope",)),
    Case("rubrics-show-unknown", ["rubrics", "show", "nope", "--db", "{db}"], ("nope",)),
    Case("lineage-unknown", ["lineage", "nope", "--db", "{db}"], ("nope",)),
    Case("lineage-kind-unknown", ["lineage", "reasoning", "--kind", "poem", "--db", "{db}"], ("--kind", "poem")),
    Case("runs-show-unknown", ["runs", "show", "nope", "--db", "{db}"], ("nope",)),
    Case("proposals-show-unknown", ["proposals", "show", "nope", "--db", "{db}"], ("nope",)),
    Case("proposals-list-status-unknown", ["proposals", "list", "--status", "maybe", "--db", "{db}"],
         ("--status", "maybe")),
    Case("proposals-list-run-unknown", ["proposals", "list", "--run", "nope", "--db", "{db}"], ("nope",)),
    Case("report-run-unknown", ["report", "nope", "--out", "{T}/r.html", "--db", "{db}"], ("nope",)),
    Case("report-out-unwritable", ["report", "r1", "--out", "/proc/coevo/r.html", "--db", "{db}"], ("/proc/coevo",)),
    Case("report-out-is-folder", ["report", "r1", "--out", "{T}/folder", "--db", "{db}"], ("folder",),
         lambda t: (t / "folder").mkdir()),
    Case("serve-port-negative", ["serve", "--port", "-1", "--db", "{db}"], ("--port",)),
    Case("serve-port-too-big", ["serve", "--port", "70000", "--db", "{db}"], ("--port",)),
    Case("quickstart-rounds-zero", ["quickstart", "--rounds", "0", "--db", "{db}"], ("--rounds",)),
    Case("quickstart-rounds-text", ["quickstart", "--rounds", "two", "--db", "{db}"], ("--rounds",)),
    Case("unknown-command", ["frobnicate"], ("frobnicate",)),
    Case("unknown-subcommand", ["harness", "frobnicate"], ("frobnicate",)),
]


# --- the store every case runs against ------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A store holding the seed assets and a run `r1` with one round."""
    from coevo.store import Store

    d = tmp_path_factory.mktemp("template")
    url = f"sqlite:///{d / 'store.db'}"
    r = runner.invoke(app, ["init", "--assets", str(REPO), "--db", url])
    assert r.exit_code == 0, r.output
    with Store.open(url) as store:
        rec = store.create_run("r1", config={"config": {"name": "r1"}}, mode="gated", status="finished")
        store.start_round(rec.id, 0)
    return d / "store.db"


def dump(path: Path) -> dict[str, list]:
    """Every table of a SQLite file, rows sorted (what "unchanged" compares)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {n: sorted(map(repr, con.execute(f'SELECT * FROM "{n}"'))) for n in sorted(names)}
    finally:
        con.close()


def files(t: Path) -> set[str]:
    return {str(p.relative_to(t)) for p in t.rglob("*")
            if not p.name.endswith(("-wal", "-shm", "-journal")) and "seed" not in p.parts[len(t.parts):][:1]}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clear_line_and_changes_nothing(case, template, tmp_path, monkeypatch):
    t = tmp_path / "t"
    t.mkdir()
    # SQLite's backup API: the copy holds what is committed, WAL included (a file copy would
    # miss the pages still in the template's -wal file while a connection keeps it open)
    src, dst = sqlite3.connect(template), sqlite3.connect(t / "store.db")
    with dst:
        src.backup(dst)
    src.close()
    dst.close()
    shutil.copytree(REPO / "harnesses", t / "seed" / "harnesses")
    shutil.copytree(REPO / "skills", t / "seed" / "skills")
    shutil.copytree(REPO / "rubrics", t / "seed" / "rubrics")
    if case.setup:
        case.setup(t)
    db = f"sqlite:///{t / 'store.db'}"
    monkeypatch.chdir(t)
    monkeypatch.setenv("COEVO_DB", db)  # a fallback to the default store shows as a success
    monkeypatch.setenv("COEVO_HOME", str(t / "home"))
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    subs = {"{db}": db, "{T}": str(t), "{seed}": str(t / "seed"), "{cfg}": str(t / "cfg.yaml")}
    argv = []
    for a in case.argv:
        for k, v in subs.items():
            a = a.replace(k, v)
        argv.append(a)
    others = {p: p.read_bytes() for p in t.iterdir() if p.suffix == ".db" and p.name != "store.db" and p.is_file()}
    before, listing = dump(t / "store.db"), files(t)

    r = runner.invoke(app, argv)

    out = r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), f"traceback: {r.exception!r}"
    assert r.exit_code != 0, f"accepted: {out[-300:]}"
    lines = out.strip().splitlines()
    assert len(lines) == 1, f"{len(lines)} lines: {out[:600]}"
    assert "Traceback" not in out
    for word in case.expect:
        assert word in lines[0], f"{word!r} not named in: {lines[0]}"
    assert dump(t / "store.db") == before
    assert files(t) == listing, f"left behind: {sorted(files(t) - listing)}"
    for p, data in others.items():
        assert p.read_bytes() == data, f"{p.name} changed"


@pytest.mark.parametrize("name", ["a:b.db", "a%20b.db", "a#b?.db"])
def test_sqlite_path_with_url_characters_is_that_file(name, tmp_path):
    """A SQLite path holding `:` `%` `#` `?` names exactly that file (once a traceback from
    alembic's config, or a silently different file: `%20` decoded to a space)."""
    from coevo.store import Store

    r = runner.invoke(app, ["init", "--assets", str(REPO), "--db", str(tmp_path / name)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / name).is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db") == [name]
    seeds = len(list((REPO / "harnesses").glob("*.yaml")))
    assert seeds >= 4 and len(Store.open(str(tmp_path / name)).list_assets("harness")) == seeds


def test_proposer_option_named_name_reaches_the_proposer():
    """`name` in a proposer's options is its option (the scripted proposer's display name),
    not the registry name make_proposer takes: once a TypeError, now what it says."""
    from coevo.propose.base import make_proposer

    assert make_proposer("scripted", name="mine").name == "mine"


def test_at_least_120_distinct_cases():
    assert len({c.id for c in CASES}) == len(CASES) >= 120


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_read_only_store_file_is_one_line(template, tmp_path):
    p = tmp_path / "ro.db"
    shutil.copy(template, p)
    p.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        before = dump(p)
        r = runner.invoke(app, ["init", "--assets", str(REPO), "--db", str(p)])
        assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1, r.output
        assert "read-only" in r.output and dump(p) == before
    finally:
        tmp_path.chmod(0o755)
