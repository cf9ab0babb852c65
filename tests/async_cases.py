"""What the asynchronous algorithms' tests share: a heterogeneous fleet, metric rows without wall time,
and a run interrupted after a round and resumed from its last checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedge
from fedge.files import results
from fedge.runner.checkpoint import load

WALL = ("wall_seconds",)
IDENTICAL = {"distance_min_m": 200.0, "distance_max_m": 200.0}  # with iid equal data: every job alike
HETEROGENEOUS = {"devices": {"cpu_hz": [1e6, 1e7], "availability": 0.8}}  # 10x compute spread


def rows(result: fedge.Result) -> list[dict]:
    """A run's metric rows without wall-clock time."""
    return [{k: v for k, v in row.items() if k not in WALL} for row in result.metrics]


class Killed(Exception):
    """Raised after a round to interrupt a run."""


def interrupted_and_resumed(cfg: dict, tmp_path: Path, after: int) -> tuple[fedge.Result, dict, fedge.Result]:
    """``cfg`` run through, then again under ``tmp_path / 'cut'`` interrupted after round ``after`` and
    resumed: the reference, the algorithm state of the checkpoint the interrupted run left, and the
    resumed result (whose ledger and rows must be the reference's)."""
    reference = fedge.run(cfg)

    def die(t: int, row: dict) -> None:
        if t == after:
            raise Killed

    cut = {**cfg, "output": {**cfg["output"], "dir": str(tmp_path / "cut")}}
    with pytest.raises(Killed):
        fedge.run(cut, on_round=die)
    run_dir = tmp_path / "cut" / cfg["output"]["name"]
    saved = load(run_dir / results.CHECKPOINT).state["algorithm"]
    resumed = fedge.resume(run_dir)
    assert rows(resumed) == rows(reference)
    assert (run_dir / "ledger.csv").read_bytes() == (reference.run_dir / "ledger.csv").read_bytes()
    return reference, saved, resumed
