"""Checks on command-line flag values, run by click while it parses (so a bad value fails before
the store is opened): `--split holdout` or `--run ../x` is one line naming the flag."""

from __future__ import annotations

from typing import Any, Callable, Optional

import typer


def choice(*names: str) -> Callable[[Optional[str]], Optional[str]]:
    """A typer callback accepting only `names` (or no value)."""

    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and value not in names:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(names)}")
        return value

    return check


def positive(value: Any) -> Any:
    """A typer callback for a number that must be > 0 (a learning rate)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value} is not > 0")
    return value


def run_name(value: Optional[str]) -> Optional[str]:
    """A typer callback for a run name (the rule of coevo.store.runs.run_name_problem)."""
    from coevo.store.runs import run_name_problem

    if value is not None:
        problem = run_name_problem(value)
        if problem:
            raise typer.BadParameter(f"{value!r} {problem}")
    return value


def proposal_status(value: Optional[str]) -> Optional[str]:
    from coevo.store.records import PROPOSAL_STATUSES  # not at import: `coevo --help` stays fast

    return choice(*PROPOSAL_STATUSES)(value)


def not_empty(value: Optional[str]) -> Optional[str]:
    if value is not None and not value.strip():
        raise typer.BadParameter("is empty")
    return value


def track(value: Optional[str]) -> Optional[str]:
    """A typer callback for `--track BACKEND[:WHERE]` (coevo.tracking.TrackingSpec.parse): a
    bad spec, or a backend whose package is missing, fails before any work starts."""
    if value is None:
        return value
    from coevo.tracking import TrackingError, TrackingSpec

    try:
        spec = TrackingSpec.parse(value)
        if spec is not None:
            spec.check()
    except (ValueError, TrackingError) as e:
        raise typer.BadParameter(str(e).removeprefix("tracking: ")) from None
    return value


TrackOption = typer.Option(None, "--track", callback=track, help=(
    "Log to an experiment tracker: trackio[:PROJECT] | mlflow[:URI] | off "
    "(extras coevo\\[trackio], coevo\\[mlflow]); overrides the config's tracking:."))
