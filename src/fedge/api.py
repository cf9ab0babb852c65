"""The Python API: ``fedge.run(config) -> Result`` and ``fedge.resume(run_dir) -> Result``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedge.config import RunConfig, apply_override, load_config, load_raw, parse_config
from fedge.errors import ConfigError
from fedge.runner import Result, open_run, start_run  # the runner fills the algorithm registry

__all__ = ["Result", "RunConfig", "load_config", "resolve_config", "resume", "run"]

# on_round(t, row): called after every round with that round's record (the row metrics.jsonl gets;
# it has "accuracy" when the round was evaluated): progress bars, logging, custom stop logic.
RoundCallback = Callable[[int, dict[str, Any]], None]


EXAMPLE_PREFIX = "example:"


def examples_dir() -> Path:
    """The example configs shipped with fedge (``fedge run example:NAME``)."""
    return Path(__file__).parent / "examples"


def config_source(config: str | Path) -> Path:
    """The file of a config argument: a path, or ``example:NAME`` for a shipped example."""
    text = str(config)
    if not text.startswith(EXAMPLE_PREFIX):
        return Path(config)
    name = text[len(EXAMPLE_PREFIX) :]
    path = examples_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        known = sorted(p.stem for p in examples_dir().glob("*.yaml"))
        raise ConfigError(text, f"no such example; known: {', '.join(known)}")
    return path


def resolve_config(
    config: RunConfig | dict | str | Path | None = None, overrides: list[str] | None = None
) -> RunConfig:
    """A validated config from a :class:`RunConfig`, a dict, a YAML path or nothing (the quickstart)."""
    if isinstance(config, RunConfig):
        raw = config.model_dump(mode="json")
    elif isinstance(config, dict):
        raw = dict(config)
    else:
        raw = load_raw(config_source(config) if config is not None else None)
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
    quickstart (FedAvg on scikit-learn's digits), or ``"example:NAME"`` for a shipped example;
    ``overrides`` are dotted ``key=value`` strings; ``on_round(t, row)`` is called after every round;
    ``force`` skips the memory pre-flight. Bad input raises :class:`~fedge.errors.FedgeError` before any
    directory exists; a NaN or infinite number raises :class:`~fedge.errors.Diverged`
    (``stop.on_nonfinite: error``).
    """
    return start_run(resolve_config(config, overrides), on_round=on_round, force=force).run()


def resume(run_dir: str | Path, on_round: RoundCallback | None = None, force: bool = False) -> Result:
    """Continue an interrupted run from its last (verified) checkpoint to the identical result."""
    return open_run(Path(run_dir), on_round=on_round, force=force).run()
