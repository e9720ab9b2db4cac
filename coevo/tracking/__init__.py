"""Experiment tracking (trackio, MLflow): see coevo/tracking/base.py for the backends and the
spec, coevo/tracking/observer.py for what a run logs. Importing this package imports neither
tracker library."""

from __future__ import annotations

from typing import Any, Callable

from coevo.observer import NoObserver, RunObserver
from coevo.tracking.base import (
    TRACKERS,
    Tracker,
    TrackerLink,
    TrackingError,
    TrackingSpec,
    flatten,
)

__all__ = ["TRACKERS", "Tracker", "TrackerLink", "TrackingError", "TrackingSpec", "flatten",
           "observer_for", "resumed_spec", "with_track_flag"]


def observer_for(spec: TrackingSpec | None, store: Any, say: Callable[[str], None]) -> RunObserver:
    """The run's observer: a TrackingObserver for `spec`, NoObserver without one."""
    if spec is None:
        return NoObserver()
    from coevo.tracking.observer import TrackingObserver

    return TrackingObserver(spec, store, say)


def with_track_flag(cfg: Any, flag: str | None) -> Any:
    """A RunConfig with `--track FLAG` in place of its `tracking:` (no flag: as it is)."""
    if flag is None:
        return cfg
    return cfg.model_copy(update={"tracking": TrackingSpec.parse(flag)})


def resumed_spec(flag: str | None, stored: dict[str, Any]) -> TrackingSpec | None:
    """`coevo train`'s tracker: `--track FLAG`, else the one the run last logged to (a resume
    continues it), else none."""
    if flag is not None:
        return TrackingSpec.parse(flag)
    from coevo.tracking.observer import links

    known = links(stored)
    return known[-1].spec() if known else None
