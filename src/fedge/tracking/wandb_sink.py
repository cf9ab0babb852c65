"""Weights & Biases sink (``fedge[wandb]``): the config, every round's scalars and the summary.

``mode: offline`` writes the W&B run under the run directory for a later ``wandb sync``; the W&B run id
is kept in the run directory so a resumed run continues the same W&B run.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import wandb

from fedge.config import RunConfig, TrackerConfig
from fedge.tracking import RunIds, flat_config


class WandbSink:
    """One W&B run per fedge run, in project ``project`` (default ``fedge``)."""

    def __init__(self, tracker: TrackerConfig, run_dir: Path, config: RunConfig, start: int):
        ids = RunIds(run_dir)
        run_id = ids.get("wandb") or uuid.uuid4().hex[:12]
        ids.set("wandb", run_id)
        self.run = wandb.init(
            project=tracker.project or "fedge",
            name=Path(run_dir).name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=tracker.mode,
            config=flat_config(config),
            reinit="create_new",
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def finish(self, summary: dict[str, float]) -> None:
        self.run.summary.update({f"summary/{key}": value for key, value in summary.items()})

    def close(self) -> None:
        self.run.finish()
