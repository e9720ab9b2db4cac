"""Progress bars for the long commands (`coevo quickstart`, `run`, `eval`): the library's count
events, `(phase, done, total)`, shown as rich bars with the count, elapsed time and an ETA.

The library only reports counts (coevo.loop's `on_count`, coevo.evaluate's `progress`); this
is the CLI's observer. One bar per phase ("round 0: RL steps", "round 0: gate 1/2", "final:
test"); `done >= total` ends the phase: its bar is printed once as a finished line above the
live ones and leaves the live display, so a long run leaves a log of its phases, not a growing
stack of bars. A repeated end event of an ended phase is ignored.

Not a terminal (a pipe, a file, CI): no bars at all and no control codes; the command's own
lines (the loop's messages, the summary) are the whole output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from coevo.terminal import escaped


class Bars:
    """`bars(phase, done, total)` moves the phase's bar; a context manager around the work."""

    def __init__(self, console: Console):
        self.console = console
        self._ids: dict[str, Any] = {}
        self._progress = None
        if console.is_terminal and not console.is_dumb_terminal:
            # A step of RL takes tens of seconds: estimate the speed over ten minutes, not
            # rich's default 30 s, or the ETA would be blank between steps.
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=console, speed_estimate_period=600.0)

    def __enter__(self) -> "Bars":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, phase: str, done: int, total: int) -> None:
        p = self._progress
        if p is None:
            return
        task = self._ids.get(phase)
        if task is None:
            if done >= total:  # a phase that ends as it starts, or a repeated end
                return
            task = self._ids[phase] = p.add_task(escaped(phase), total=total)
        p.update(task, completed=done, total=total)
        if done >= total:
            finished = [t for t in p.tasks if t.id == task]
            p.remove_task(task)
            del self._ids[phase]
            p.refresh()  # the live area without it, before the finished line prints above
            p.console.print(p.make_tasks_table(finished))

    def counter(self, phase: str) -> Callable[[int, int], None]:
        """A (done, total) hook that moves `phase`'s bar (coevo.evaluate's `progress`)."""
        return lambda done, total: self(phase, done, total)
