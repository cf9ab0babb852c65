"""MLflow sink (``fedge[mlflow]``): the config as parameters, every round's scalars as step metrics.

It reports through an ``MlflowClient`` (no global active run, so runs in one process never mix) to
``uri`` or MLflow's default (``MLFLOW_TRACKING_URI``); the MLflow run id is kept in the run directory
so a resumed run continues the same MLflow run.
"""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from fedge.config import RunConfig, TrackerConfig
from fedge.tracking import RunIds, flat_config

BATCH = 1000  # MLflow's most metrics per log_batch call


class MlflowSink:
    """One MLflow run per fedge run, in experiment ``project`` (default ``fedge``)."""

    def __init__(self, tracker: TrackerConfig, run_dir: Path, config: RunConfig):
        self.client = MlflowClient(tracking_uri=tracker.uri)
        ids = RunIds(run_dir)
        run_id = ids.get("mlflow")
        if run_id is None:
            name = tracker.project or "fedge"
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            run_id = self.client.create_run(experiment_id, run_name=Path(run_dir).name).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in flat_config(config).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i : i + 100])
            ids.set("mlflow", run_id)
        self.run_id = run_id

    def log(self, step: int, scalars: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])

    def finish(self, summary: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(f"summary/{key}", value, now, 0) for key, value in summary.items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])
        self.client.set_terminated(self.run_id)

    def close(self) -> None:
        """Nothing held open: every call went to the store already."""
