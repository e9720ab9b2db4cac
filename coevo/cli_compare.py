"""`coevo compare-checkpoints A B --env ENV`: Reach-or-Solve (coevo/reach.py) from the store.
Registered on coevo.cli's app; the command is a few lines calling the library."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from coevo import cli
from coevo.cli import DbOption, _store
from coevo.cliflags import choice, not_empty
from coevo.terminal import escaped


def reach_table(res) -> Table:
    """The decomposition as a table: each arm's score, the gain, REACH and SOLVE."""
    f = lambda x: "-" if x is None else f"{x:+.3f}"  # noqa: E731
    share = lambda x: "-" if x is None or not res.gain else f"{x / res.gain:.0%}"  # noqa: E731
    t = Table(title=f"reach or solve: {escaped(res.b)} over {escaped(res.a)} ({res.metric})")
    for col in ("", "value", "share of gain"):
        t.add_column(col)
    t.add_row(f"A {escaped(res.a)}", f(res.p_a).lstrip("+"), "")
    t.add_row(f"B {escaped(res.b)}", f(res.p_b).lstrip("+"), "")
    t.add_row("gain B - A", f(res.gain), "")
    t.add_row("REACH (states only B reached)", f(res.reach), share(res.reach))
    t.add_row("SOLVE (from states both reached)", f(res.solve), share(res.solve))
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    t.caption = (f"{res.tasks} tasks both ran ({res.left_out} left out), episodes A "
                 f"{res.episodes_a} / B {res.episodes_b}; B's episodes through new states "
                 f"{pct(res.new_fraction_b)}, A's through states B never reached "
                 f"{pct(res.lost_fraction_a)}")
    return t


@cli.app.command("compare-checkpoints")
def compare_checkpoints_cmd(
    a: str = typer.Argument(..., help="Earlier checkpoint: id, sha256, or 'base' (no checkpoint)."),
    b: str = typer.Argument(..., help="Later checkpoint: id, sha256, or 'base'."),
    env: str = typer.Option(..., "--env", callback=not_empty, help="Environment spec the trajectories ran on."),
    run: Optional[str] = typer.Option(None, "--run", help="Only this run's trajectories."),
    split: Optional[str] = typer.Option(None, "--split", callback=choice("train", "val", "test"),
                                        help="Only this split (default: all)."),
    metric: str = typer.Option("success", "--metric", callback=choice("success", "outcome", "reward"),
                               help="success | outcome | reward"),
    any_step: bool = typer.Option(False, "--any-step", help="Also RL rollouts of later weights "
                                  "recorded under the checkpoint (default: exactly its weights)."),
    as_json: bool = typer.Option(False, "--json", help="Print the decomposition (with per-task rows) as JSON."),
    db: Optional[str] = DbOption,
) -> None:
    """Split B's gain over A into REACH (states only B reached) and SOLVE (from states both reached)."""
    from coevo.reach import compare_checkpoints

    res = compare_checkpoints(_store(db), a, b, env, run=run, split=split, metric=metric,
                              exact=not any_step)
    if as_json:
        typer.echo(json.dumps(res.model_dump(mode="json"), indent=1))
    else:
        cli.console.print(reach_table(res))
