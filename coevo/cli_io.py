"""Commands that bring a team's own material in and take coevo's out: a harness as an OpenAI
request body (`harness import --openai`, `harness export --openai`) and production traces
(`traces import`). Registered on coevo.cli's sub-apps; each command a few lines calling the
library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from coevo import cli
from coevo.cli import DbOption, _short, _store, harness_app
from coevo.terminal import escaped

traces_app = typer.Typer(no_args_is_help=True, help="Imported production traces: import.")
splits_app = typer.Typer(no_args_is_help=True, help="Frozen validation splits: freeze, check.")
cli.app.add_typer(traces_app, name="traces")
cli.app.add_typer(splits_app, name="splits")


@harness_app.command("import")
def harness_import(
    openai: Path = typer.Option(..., "--openai", help="A chat-completions request body (JSON)."),
    name: Optional[str] = typer.Option(None, "--name", help="Harness name (default: the file name's stem)."),
    db: Optional[str] = DbOption,
) -> None:
    """Store a harness version read from an OpenAI chat-completions request body."""
    from coevo.assets.openai_format import harness_from_request, read_request

    imported = harness_from_request(read_request(openai), name or openai.stem, str(openai))
    h = imported.harness
    for line in imported.left_out:
        cli.console.print(f"left out: {escaped(line)}", highlight=False)
    store = _store(db)
    known = h.hash in {r.hash for r in store.list_assets("harness")}
    store.put_asset(h)
    cli.console.print(f"harness {escaped(h.name)} {_short(h.hash)} ({'exists' if known else 'new'}): "
                  f"{len(h.tools)} tools, {len(h.demos)} demos", highlight=False)


def export_openai(ref: str, out: Path, db: Optional[str]) -> None:
    """`coevo harness export REF --openai FILE`: the request body that deploys the version."""
    from coevo.assets.openai_format import request_from_harness

    h = _store(db).get_asset("harness", ref)
    body, notes = request_from_harness(h, f"harness {h.name} {_short(h.hash)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    for line in notes:
        cli.console.print(f"not in the request (the deploying application's loop): {escaped(line)}",
                      highlight=False)
    cli.console.print(f"wrote {escaped(str(out))}", highlight=False)


@traces_app.command("import")
def traces_import(
    file: Path = typer.Argument(..., help="OpenAI chat-format JSONL: messages, tools, outcome, feedback."),
    env: str = typer.Option(..., "--env", help="The environment the traces belong to, e.g. jsonl:tasks.jsonl"),
    db: Optional[str] = DbOption,
) -> None:
    """Store production traces as imported evidence for the proposers (never trained on,
    never used for validation)."""
    from coevo.envs.registry import make_env
    from coevo.traces import import_traces

    new, known = import_traces(_store(db), file, make_env(env).name)
    cli.console.print(f"{new} traces imported for {escaped(env)} ({known} already stored)",
                      highlight=False)


@splits_app.command("freeze")
def splits_freeze(
    env: str = typer.Argument(..., help="Environment spec, e.g. jsonl:tasks.jsonl or bfcl:simple_python"),
    out: Path = typer.Option(..., "--out", help="File to write, e.g. validation/NAME.yaml"),
    n: Optional[int] = typer.Option(None, "--n", help="At most this many tasks per split (default: all)."),
    splits: str = typer.Option("val,test", "--splits", help="Comma-separated splits to freeze."),
) -> None:
    """Write the task ids and content hash of an environment's val and test splits; a run
    config naming the file (splits.frozen) refuses to run when they change."""
    from coevo.envs.registry import make_env
    from coevo.frozen_splits import describe, freeze, write_frozen

    frozen = freeze(make_env(env), env, n, tuple(s.strip() for s in splits.split(",") if s.strip()))
    path = write_frozen(frozen, out)
    cli.console.print(f"wrote {escaped(str(path))}: {escaped(str(describe(frozen)))}", highlight=False)


@splits_app.command("check")
def splits_check(file: Path = typer.Argument(..., help="A frozen split file (validation/NAME.yaml).")) -> None:
    """Exit 1, naming the split, when the environment no longer serves the frozen tasks."""
    from coevo.envs.registry import make_env
    from coevo.frozen_splits import check_frozen, describe, read_frozen

    frozen = read_frozen(file)
    check_frozen(file, make_env(frozen.spec))
    cli.console.print(f"{escaped(str(file))}: unchanged {escaped(str(describe(frozen)))}", highlight=False)


__all__ = ["export_openai", "harness_import", "splits_check", "splits_freeze", "traces_app", "traces_import"]
