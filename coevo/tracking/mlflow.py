"""The MLflow tracker (extra coevo[mlflow]: mlflow-skinny, which writes a `sqlite:` store or
talks to a server; its own file store is in maintenance mode and refused by MLflow 3).

A coevo run is one MLflow run in experiment `project`: the run config as params (created
once: MLflow params never change, so a resume adds none), coevo's ids as tags, metrics with
steps, each round's gate decisions as a JSON artifact `gate/decisions/<round>.json`, and the
status FINISHED or FAILED. A resume continues the run by its id (`resume_id`); one the store
no longer has is replaced by a new run. `mlflow` is imported here only, when a run is tracked.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

_BATCH = 100  # MLflow's limit of params (and tags) per log_batch call
_PARAM_CHARS = 6000  # MLflow's longest param value


class MlflowTracker:
    backend = "mlflow"

    def __init__(self, client: Any, run_id: str, resumed: bool):
        self.client, self.run_id, self.resumed = client, run_id, resumed
        self.location = client.tracking_uri

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, int(step)) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        self.client.log_dict(self.run_id, rows, f"{name}/{step}.json")

    def finish(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def open_run(spec: Any, *, name: str, resume_id: str | None, params: dict[str, Any],
             tags: dict[str, str]) -> MlflowTracker:
    # A tracking server that is down must cost seconds, not MLflow's default of 7 retries
    # with backoff at 120 s each (a user's own setting wins).
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    # MLflow's own log handler would print its INFO lines ("Creating initial MLflow database
    # tables...") between coevo's; without it they go to the root logger like other libraries'.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    from mlflow import MlflowClient
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=spec.uri)  # None: $MLFLOW_TRACKING_URI, else MLflow's default
    if resume_id is not None:
        try:
            client.get_run(resume_id)
        except MlflowException:
            resume_id = None  # gone (another store, deleted): a new run takes its place
        else:
            client.update_run(resume_id, status="RUNNING")
            return MlflowTracker(client, resume_id, resumed=True)
    exp = client.get_experiment_by_name(spec.project)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(spec.project)
    run = client.create_run(exp_id, run_name=name, tags=tags)
    values = [Param(k, _text(v)[:_PARAM_CHARS]) for k, v in sorted(params.items())]
    for i in range(0, len(values), _BATCH):
        client.log_batch(run.info.run_id, params=values[i:i + _BATCH])
    return MlflowTracker(client, run.info.run_id, resumed=False)


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)
