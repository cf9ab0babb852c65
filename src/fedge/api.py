"""The Python API: ``fedge.run(config) -> Result`` and ``fedge.resume(run_dir) -> Result``.

Both take what a researcher brings beside the config: ``model`` (any ``torch.nn.Module``; for the split
family an ``nn.Sequential`` whose ``cut`` attribute names the last client-side block by count or name),
``train`` / ``test`` (a ``torch.utils.data.Dataset`` or an ``(X, y)`` pair of tensors or numpy arrays,
split among clients by the config's partitioner) and ``loss`` (a per-sample criterion
``(logits, labels) -> losses``). docs/extending.md walks through them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from fedge.config import RunConfig
from fedge.data.user import UserData
from fedge.engine import Criterion
from fedge.extend import load_config, parse_config
from fedge.intake.locate import raw_config
from fedge.runner.loop import (  # the runner fills the algorithm registry
    Extensions,
    Result,
    open_run,
    start_run,
)

__all__ = ["Result", "RunConfig", "load_config", "resolve_config", "resume", "run"]

# on_round(t, row): called after every round with that round's record (the row metrics.jsonl gets;
# it has "accuracy" when the round was evaluated): progress bars, logging, custom stop logic.
RoundCallback = Callable[[int, dict[str, Any]], None]


def resolve_config(
    config: RunConfig | dict | str | Path | None = None,
    overrides: list[str] | None = None,
    extensions: Extensions | None = None,
) -> RunConfig:
    """A validated config from a :class:`RunConfig`, a dict, a YAML path or string, or nothing (the
    quickstart). With a caller's model or data, ``model.name`` / ``data.name`` say ``custom``. The
    caller's dict is read, never changed: overrides apply to a copy, so a next run sees it as written."""
    ext = extensions or Extensions()
    return parse_config(raw_config(config, overrides, ext.model is not None, ext.train is not None))


def run(
    config: RunConfig | dict | str | Path | None = None,
    overrides: list[str] | None = None,
    on_round: RoundCallback | None = None,
    force: bool = False,
    *,
    model: nn.Module | None = None,
    train: UserData | None = None,
    test: UserData | None = None,
    loss: Criterion | None = None,
) -> Result:
    """Run a config to its last round and return its metrics and summary.

    ``config`` may be a :class:`RunConfig`, a nested dict, a YAML file path, or ``None`` for the built-in
    quickstart (FedAvg on scikit-learn's digits), ``"example:NAME"`` for a shipped example, or YAML text;
    ``overrides`` are dotted ``key=value`` strings; ``on_round(t, row)`` is called after every round;
    ``force`` skips the memory pre-flight. Bad input raises :class:`~fedge.errors.FedgeError` before any
    directory exists; a NaN or infinite number raises :class:`~fedge.errors.Diverged`
    (``stop.on_nonfinite: error``). ``model``, ``train`` / ``test`` and ``loss`` replace the config's
    model, data and loss (module docstring; ``test`` defaults to a seeded ``data.test_fraction`` of
    ``train``).
    """
    ext = Extensions(model, train, test, loss)
    return start_run(
        resolve_config(config, overrides, ext), on_round=on_round, force=force, extensions=ext
    ).run()


def resume(
    run_dir: str | Path,
    on_round: RoundCallback | None = None,
    force: bool = False,
    *,
    model: nn.Module | None = None,
    train: UserData | None = None,
    test: UserData | None = None,
    loss: Criterion | None = None,
    rounds: int | None = None,
) -> Result:
    """Continue an interrupted run from its last (verified) checkpoint to the identical result (a run
    of a caller's model or data needs the same objects again). ``rounds`` gives the run another length:
    a finished run goes on to more rounds, with the numbers a run of that length gives, unless its
    algorithm has a schedule over the run (:mod:`fedge.runner.run_length`)."""
    ext = Extensions(model, train, test, loss)
    return open_run(Path(run_dir), on_round=on_round, force=force, extensions=ext, rounds=rounds).run()
