"""Experiment trackers behind one small interface: TensorBoard, MLflow and Weights & Biases.

A run lists its trackers in ``tracking:`` (``[tensorboard]``, or blocks with options). Each is a
:class:`Sink` that receives every round's record as flat scalars (every numeric metric, the cumulative
bits per link and kind, the storage per node) and the summary at the end. TensorBoard needs no extra
package (fedge writes the event files itself); MLflow and W&B need ``fedge[mlflow]`` / ``fedge[wandb]``.
No tracker is needed to run fedge.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from fedge.config import RunConfig, TrackerConfig
from fedge.errors import ConfigError
from fedge.files import results

IDS = "tracking.json"  # tracker run ids, so a resumed run reports to the same tracker run


class Sink(Protocol):
    """Where a run's records go: one call per round, one at the end, then ``close``."""

    def log(self, step: int, scalars: dict[str, float]) -> None: ...

    def finish(self, summary: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _tag(name: str) -> str:
    return name.replace(":", "_")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A record (or summary) as flat ``name -> number``: nested maps become ``outer/inner`` names."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}/{_tag(str(key))}" if prefix else _tag(str(key)), inner)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[prefix] = float(value)

    walk("", {k: v for k, v in row.items() if k != "round"})
    return out


def flat_config(config: RunConfig) -> dict[str, Any]:
    """The config as ``dotted.key -> value`` (lists as text), the parameters trackers show."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            out[prefix] = json.dumps(value) if isinstance(value, list) else value

    walk("", config.model_dump(mode="json", exclude={"tracking"}))
    return out


class RunIds:
    """Tracker run ids kept in the run directory (``tracking.json``)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / IDS
        self.ids = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, name: str) -> str | None:
        return self.ids.get(name)

    def set(self, name: str, value: str) -> None:
        self.ids[name] = value
        results.write_json(self.path, self.ids)


def open_sink(tracker: TrackerConfig, run_dir: Path, config: RunConfig, start: int) -> Sink:
    """The sink of one tracker, reporting rounds after ``start`` (earlier ones were reported before)."""
    if tracker.name == "tensorboard":
        from fedge.tracking.tensorboard_sink import TensorBoardSink

        return TensorBoardSink(Path(run_dir) / "tensorboard", start)
    try:
        if tracker.name == "mlflow":
            from fedge.tracking.mlflow_sink import MlflowSink

            return MlflowSink(tracker, run_dir, config)
        from fedge.tracking.wandb_sink import WandbSink

        return WandbSink(tracker, run_dir, config, start)
    except ImportError:
        install = f"pip install 'fedge[{tracker.name}]'"
        raise ConfigError("tracking", f"{tracker.name} is not installed: {install}") from None
    except Exception as error:  # a tracker's own failure (no server, no login) names it in one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError("tracking", f"{tracker.name} could not start: {first}") from None


class Tracking:
    """Every sink of a run, fed together."""

    def __init__(self, config: RunConfig, run_dir: Path, start: int):
        self.sinks = [open_sink(tracker, run_dir, config, start) for tracker in config.tracking]

    def log(self, row: dict[str, Any]) -> None:
        if self.sinks:
            values = scalars(row)
            for sink in self.sinks:
                sink.log(row["round"], values)

    def finish(self, summary: dict[str, Any]) -> None:
        values = scalars(summary)
        for sink in self.sinks:
            sink.finish(values)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
