"""The Python API: ``fedge.run(config) -> Result`` and ``fedge.resume(run_dir) -> Result``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedge.config import RunConfig, apply_override, load_raw, parse_config
from fedge.runner import Result, open_run, start_run

RoundCallback = Callable[[int, dict[str, Any] | None], None]


def resolve_config(
    config: RunConfig | dict | str | Path | None = None, overrides: list[str] | None = None
) -> RunConfig:
    """A validated config from a :class:`RunConfig`, a dict, a YAML path or nothing (the quickstart)."""
    if isinstance(config, RunConfig):
        raw = config.model_dump(mode="json")
    elif isinstance(config, dict):
        raw = dict(config)
    else:
        raw = load_raw(Path(config) if config is not None else None)
    for assignment in overrides or []:
        apply_override(raw, assignment)
    return parse_config(raw)


def run(
    config: RunConfig | dict | str | Path | None = None,
    overrides: list[str] | None = None,
    on_round: RoundCallback | None = None,
    force: bool = False,
) -> Result:
    """Run a config to its last round and return its metrics and summary.

    ``config`` may be a :class:`RunConfig`, a nested dict, a YAML file path, or ``None`` for the built-in
    quickstart (FedAvg on scikit-learn's digits); ``overrides`` are dotted ``key=value`` strings; ``force``
    skips the memory pre-flight. Bad input raises :class:`~fedge.errors.FedgeError` before any directory
    exists; a NaN or infinite number raises :class:`~fedge.errors.Diverged` (``stop.on_nonfinite: error``).
    """
    return start_run(resolve_config(config, overrides), on_round=on_round, force=force).run()


def resume(run_dir: str | Path, on_round: RoundCallback | None = None, force: bool = False) -> Result:
    """Continue an interrupted run from its last (verified) checkpoint to the identical result."""
    return open_run(Path(run_dir), on_round=on_round, force=force).run()
