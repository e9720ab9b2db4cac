"""What a run tells an onlooker as it goes: the loop's (and `coevo train`'s) event points.

The loop stays an algorithm box: it calls these at fixed points and never looks at what the
observer does. An observer only reads; everything it may want is in the store by the time it
is called (a round's summary, proposals, decisions and charges), so an observer that joins
late, or after a crash, can catch up from the store. The experiment trackers are one
(coevo/tracking/observer.py); `NoObserver` is the stand-in when nothing watches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class RunObserver(Protocol):
    """Events of one run, in order: start, then per round any rl_step (as each RL step is
    stored) and round_done (after the round's summary is stored), then finished (the final
    test evaluation or None), then close. An observer guards itself: an exception it lets
    out fails the run."""

    def start(self, run_id: str) -> None: ...

    def rl_step(self, r: int, entry: Any) -> None: ...  # entry: coevo.rl.stage.StepLog

    def round_done(self, r: int) -> None: ...

    def finished(self, final: Any) -> None: ...  # final: coevo.evaluate.EvalResult | None

    def close(self, failed: bool) -> None: ...


class NoObserver:
    """Watches nothing (the default: a run without `tracking:`)."""

    def start(self, run_id: str) -> None:
        pass

    def rl_step(self, r: int, entry: Any) -> None:
        pass

    def round_done(self, r: int) -> None:
        pass

    def finished(self, final: Any) -> None:
        pass

    def close(self, failed: bool) -> None:
        pass


@contextmanager
def observing(observer: RunObserver, run_id: str) -> Iterator[RunObserver]:
    """`observer` started for `run_id`, and closed when the block ends (failed when it raised)."""
    observer.start(run_id)
    try:
        yield observer
    except BaseException:
        observer.close(failed=True)
        raise
    observer.close(failed=False)
