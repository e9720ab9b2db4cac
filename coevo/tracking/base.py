"""Experiment trackers: the `Tracker` protocol, the `tracking:` spec of a run config (also
`--track BACKEND[:WHERE]`), the registry of backends, and the link a run keeps to its tracker run.

Backends (one module each, its package imported only when a run is tracked with it):

    trackio[:PROJECT]   local-first: a SQLite file per project under a folder (`dir`, else
                        $TRACKIO_DIR, else trackio's default ~/.cache/huggingface/trackio);
                        `trackio show` opens its dashboard. Extra: coevo[trackio].
    mlflow[:URI]        an MLflow tracking URI (`uri`, else $MLFLOW_TRACKING_URI, else MLflow's
                        default `sqlite:///mlflow.db` in the current folder): a server, or a
                        local `sqlite:` store. Extra: coevo[mlflow] (mlflow-skinny).

The store stays the record of truth; a tracker is a view of it for dashboards. What is logged
and how failures are handled: coevo/tracking/observer.py.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from coevo.errors import CoevoError
from coevo.registry import Registry


class TrackingError(CoevoError):
    """A tracker cannot be used at all (its package is missing): one line, before the run."""


class Tracker(Protocol):
    """One run in an experiment tracker, created or continued by its backend's `open_run`.

    Contract: `log_metrics` takes finite floats keyed "group/name" ("val/score"); `step`
    orders the points of one key (RL metrics: the trainer step; round metrics: the round
    index). `log_table` records rows of plain values (the gate's decisions of a round).
    Any call may raise: the caller reports it and stops tracking, the run goes on."""

    backend: str
    run_id: str  # the tracker's own id of the run, stored in coevo's store
    location: str  # where the run lives: a tracking URI, a folder
    resumed: bool  # an existing tracker run was continued (else one was created)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None: ...

    def finish(self, failed: bool = False) -> None: ...


@dataclass(frozen=True)
class TrackerKind:
    """A registered backend: the package it needs, the extra that installs it, and its opener
    `open_run(spec, *, name, resume_id, params, tags) -> Tracker` as "module:function"."""

    package: str
    extra: str
    opener: str

    def check(self, backend: str) -> None:
        """A missing package is one line naming the extra (checked before any work starts)."""
        try:
            found = importlib.util.find_spec(self.package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise TrackingError(f"tracking: the {backend} backend needs the {self.package} "
                                f"package: pip install 'coevo[{self.extra}]'")

    def open(self, spec: "TrackingSpec", **kw: Any) -> Tracker:
        self.check(spec.backend)
        module, _, fn = self.opener.partition(":")
        return getattr(importlib.import_module(module), fn)(spec, **kw)


TRACKERS: Registry[TrackerKind] = Registry("tracking backend")
TRACKERS.add("trackio", TrackerKind("trackio", "trackio", "coevo.tracking.trackio:open_run"))
TRACKERS.add("mlflow", TrackerKind("mlflow", "mlflow", "coevo.tracking.mlflow:open_run"))

_WHERE = {"mlflow": "uri", "trackio": "dir"}  # the backend-specific location field


class TrackingSpec(BaseModel):
    """Where a run is tracked: `tracking:` in a run config, or `--track SPEC` (`parse`).
    No spec (the default): nothing is tracked and no tracker package is imported."""

    model_config = ConfigDict(extra="forbid")
    backend: str  # trackio | mlflow
    project: str = Field("coevo", min_length=1, max_length=200)  # trackio project / MLflow experiment
    uri: str | None = None  # mlflow only: the tracking URI (server, sqlite:///FILE)
    dir: str | None = None  # trackio only: the folder holding the project databases

    @field_validator("backend")
    @classmethod
    def _known(cls, v: str) -> str:
        return TRACKERS.check(v)

    @field_validator("uri", "dir")
    @classmethod
    def _for_backend(cls, v: str | None, info: ValidationInfo) -> str | None:
        backend = info.data.get("backend")
        if v is not None and backend is not None and _WHERE.get(backend) != info.field_name:
            raise ValueError(f"not a setting of the {backend} backend"
                             + (f" (it takes {_WHERE[backend]})" if backend in _WHERE else ""))
        if v is not None and not v.strip():
            raise ValueError("is empty")
        return v

    @classmethod
    def parse(cls, text: str) -> "TrackingSpec | None":
        """`trackio[:PROJECT]`, `mlflow[:URI]` (split at the first colon, so the URI keeps
        its own), or `off` (None: no tracking). A bad spec is a ValueError of one line.

        >>> TrackingSpec.parse("mlflow:sqlite:///runs.db").uri
        'sqlite:///runs.db'
        >>> TrackingSpec.parse("trackio:arith").project
        'arith'
        """
        text = text.strip()
        if text in ("off", "none"):
            return None
        backend, _, where = text.partition(":")
        data: dict[str, Any] = {"backend": backend}
        if where:
            data["uri" if backend == "mlflow" else "project"] = where
        try:
            return cls.model_validate(data)
        except ValidationError as e:  # its first error, on one line
            err = e.errors()[0]
            msg = err["msg"].removeprefix("Value error, ")
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{text!r}: {where}: {msg} (expected trackio[:PROJECT], "
                             "mlflow[:URI] or off)") from None

    def check(self) -> None:
        """The backend's package is installed (else a TrackingError naming the extra)."""
        TRACKERS.get(self.backend).check(self.backend)

    def open(self, *, name: str, resume_id: str | None, params: dict[str, Any],
             tags: dict[str, str]) -> Tracker:
        """Create the tracker run `name` (params and tags logged once), or continue the one
        with id `resume_id` when the backend still has it."""
        return TRACKERS.get(self.backend).open(self, name=name, resume_id=resume_id,
                                               params=params, tags=tags)


class TrackerLink(BaseModel):
    """A coevo run's link to its tracker run, kept in the store (the run's config, key
    `trackers`, one per backend and project) so a resume continues the same tracker run.
    `rounds` and `final` say what has been logged: a resume logs what is missing, once."""

    model_config = ConfigDict(extra="ignore")
    backend: str
    project: str
    location: str
    run_id: str
    name: str
    rounds: int = 0  # rounds 0..rounds-1 have their round metrics logged
    final: str | None = None  # the evaluation id of the last final test logged

    def spec(self) -> TrackingSpec:
        """The spec that reaches this tracker run again (`coevo train --resume`)."""
        where = {_WHERE[self.backend]: self.location} if self.backend in _WHERE else {}
        return TrackingSpec(backend=self.backend, project=self.project, **where)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (what trackers take as params).

    >>> flatten({"gate": {"alpha": 0.05}, "rounds": 2})
    {'gate.alpha': 0.05, 'rounds': 2}
    """
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
