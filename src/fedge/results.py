"""The results directory: atomic writes of config, metrics, summary, checkpoint, ledger and plots.

Nothing in a run directory is ever half-written: every file goes to a temporary name in the same
folder and is renamed into place, and a new run directory is assembled under a hidden temporary name
and renamed once its config is in place.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import torch

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
LEDGER = "ledger.csv"
PLOTS = "plots"


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``write(file)`` on a temporary file in the same folder, then rename it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    atomic_write(path, lambda handle: handle.write(text.encode()))


def write_json(path: Path, value: Any) -> None:
    write_text(path, json.dumps(value, indent=2) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def save_checkpoint(path: Path, state: dict) -> None:
    atomic_write(path, lambda handle: torch.save(state, handle))


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def create_run_dir(parent: Path, name: str, config_yaml: str) -> Path:
    """Create ``parent/name`` (or ``name-2``, ``name-3``... if taken) holding ``config.yaml``, atomically."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent))
    try:
        write_text(staging / CONFIG, config_yaml)
        (staging / PLOTS).mkdir()
        for attempt in range(1, 10_000):
            target = parent / (name if attempt == 1 else f"{name}-{attempt}")
            if target.exists():
                continue
            try:
                os.rename(staging, target)
            except OSError:
                continue
            return target
        raise FileExistsError(f"no free run directory name for {name!r} in {parent}")
    except BaseException:
        for item in sorted(staging.rglob("*"), reverse=True):
            item.rmdir() if item.is_dir() else item.unlink()
        staging.rmdir()
        raise
