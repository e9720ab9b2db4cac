"""The trackio tracker (extra coevo[trackio]): local-first, one SQLite file per project in a
folder, read by `trackio show` (its dashboard) or `trackio.Api`.

A coevo run is one trackio run named like it in project `project`: the run config and coevo's
ids as the run's config, metrics with steps, each round's gate decisions as a `trackio.Table`
under "gate/decisions". trackio has no run status: a failed run simply stops. A resume
continues the run by name (trackio's resume="allow"), checked against the stored id.

trackio fixes its folder when it is imported ($TRACKIO_DIR, read once): `dir` sets it before
the first import, and a process that already loaded trackio with another folder is refused
rather than logged elsewhere. trackio prints progress lines on stdout; they are swallowed so
coevo's output stays its own. `trackio` is imported here only, when a run is tracked.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coevo.errors import CoevoError


class TrackioTracker:
    backend = "trackio"

    def __init__(self, run: Any, location: str, resumed: bool):
        self.run, self.run_id, self.location, self.resumed = run, run.id, location, resumed

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items() if v is not None}, step=int(step))

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        import trackio

        self.run.log({name: trackio.Table(data=[dict(r) for r in rows])}, step=int(step))

    def finish(self, failed: bool = False) -> None:
        import trackio
        from trackio import context_vars

        with contextlib.redirect_stdout(io.StringIO()):  # "* Run finished. Uploading logs ..."
            if context_vars.current_run.get() is self.run:
                trackio.finish()
            else:
                self.run.finish()


def open_run(spec: Any, *, name: str, resume_id: str | None, params: dict[str, Any],
             tags: dict[str, str]) -> TrackioTracker:
    _use_dir(spec.dir)
    import trackio
    from trackio import utils

    with contextlib.redirect_stdout(io.StringIO()):  # "* Trackio project initialized ..."
        run = trackio.init(project=spec.project, name=name, config={**params, **tags},
                           resume="allow" if resume_id else "never", embed=False,
                           auto_log_cpu=False, auto_log_gpu=False)
    return TrackioTracker(run, str(utils.TRACKIO_DIR), resumed=resume_id is not None
                          and run.id == resume_id)


def _use_dir(folder: str | None) -> None:
    """Point trackio at `folder` (None: $TRACKIO_DIR or trackio's default)."""
    if folder is None:
        return
    want = Path(folder).expanduser().resolve()
    loaded = sys.modules.get("trackio.utils")
    if loaded is None:
        os.environ["TRACKIO_DIR"] = str(want)
    elif Path(loaded.TRACKIO_DIR).resolve() != want:
        raise CoevoError(f"tracking.dir: trackio is already loaded in this process with the "
                         f"folder {loaded.TRACKIO_DIR}, not {want}")
