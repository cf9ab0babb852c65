"""The runs a reading command is given: ``fedge plot``, ``compare`` and ``report`` take the same things.

Each argument is a run directory (``config.yaml`` and ``metrics.jsonl``), a folder holding runs at any
depth (a sweep's or a comparison's directory), or a glob pattern (``runs/cse-*``) naming either. The
runs are returned once each, in the order given (a folder's in name order).
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from fedge.errors import FedgeError
from fedge.files import results

GLOB_CHARACTERS = "*?["


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory (its config and its metrics are there)."""
    return (path / results.METRICS).is_file() and (path / results.CONFIG).is_file()


def _matches(argument: str) -> list[Path]:
    """The paths an argument names: itself, or the folders its glob pattern matches (files it matches
    beside them, such as a sweep's index.csv for ``SWEEP/*``, are no runs and are passed over)."""
    if Path(argument).exists() or not any(char in argument for char in GLOB_CHARACTERS):
        return [Path(argument)]
    found = [Path(match) for match in sorted(glob.glob(argument, recursive=True))]
    if not any(path.is_dir() for path in found):
        raise FedgeError(f"{argument}: the pattern matches no directory")
    return [path for path in found if path.is_dir()]


def names_runs(arguments: Sequence[str | Path]) -> bool:
    """Whether ``arguments`` name runs (each an existing folder, or a pattern matching one) rather than a
    config and overrides."""
    if not arguments:
        return False
    for argument in map(str, arguments):
        try:
            if not all(path.is_dir() for path in _matches(argument)):
                return False
        except FedgeError:
            return False
    return True


def find_run_dirs(arguments: Sequence[str | Path]) -> list[Path]:
    """Every run directory that ``arguments`` name (see the module docstring); a one-line error for an
    argument that names none."""
    found: list[Path] = []
    for argument in map(str, arguments):
        for path in _matches(argument):
            if is_run_dir(path):
                found.append(path)
            elif path.is_dir():
                under = sorted(p.parent for p in path.rglob(results.METRICS) if is_run_dir(p.parent))
                if not under:
                    raise FedgeError(f"{path}: no run directories (config.yaml + metrics.jsonl) here")
                found.extend(under)
            elif path.exists():
                raise FedgeError(f"{path}: not a run directory, a sweep directory or a folder of runs")
            else:
                raise FedgeError(f"{path}: no such directory")
    return list(dict.fromkeys(found))
