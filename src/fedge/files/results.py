"""The results directory: atomic writes, run-directory creation and locking, and strict JSON.

Nothing in a run directory is ever half-written: every file goes to a temporary name in the same
folder and is renamed into place, and a new run directory is assembled under a hidden temporary name
and renamed once its config is in place; both get the permissions the umask allows
(:mod:`fedge.files.umask`), not the temporary names' 0600 / 0700. JSON files are strict JSON (a NaN or
infinity is written as ``null``). A run directory is locked while a process runs it, so a second
``resume`` of it is refused instead of racing the first; the lock goes with the process, even a killed
one. A folder or file that cannot be written is a one-line :class:`~fedge.errors.PathError`, never a
traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from fedge.errors import ConfigError, PathError
from fedge.files import umask

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINT = "checkpoint.pt"
LEDGER = "ledger.csv"
ENERGY = "energy.csv"  # every node's simulated joules, by phase
PRIVACY = "privacy.csv"  # every release of a private quantity (a run with privacy mechanisms)
PLOTS = "plots"


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` through ``write(file)`` on a temporary file in the same folder, then rename it."""
    path = Path(path)
    staging = contextlib.ExitStack()
    try:
        handle = staging.enter_context(umask.staged_file(path, sync=True))
    except OSError as error:
        raise PathError(path.parent, f"cannot be written ({_reason(error)})") from None
    try:
        with staging:
            write(handle)
    except OSError as error:
        raise PathError(path, f"cannot be written ({_reason(error)})") from None


def write_text(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    atomic_write(path, lambda handle: handle.write(text.encode()))


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None`` (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value


def write_json(path: Path, value: Any) -> None:
    write_text(path, json.dumps(strict_json(value), indent=2, allow_nan=False) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    write_text(path, "".join(json.dumps(strict_json(row), allow_nan=False) + "\n" for row in rows))


def append_jsonl(path: Path, row: dict) -> None:
    """Add ``row`` as the last line of ``path``. Not atomic by itself: a run's checkpoint records how
    many rows are its own, and a resume drops a line a kill left half-written (``Runner.settle``)."""
    line = json.dumps(strict_json(row), allow_nan=False) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line)
    except OSError as error:
        raise PathError(path, f"cannot be written ({_reason(error)})") from None


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file; a one-line :class:`PathError` if it cannot be read or parsed. A last
    line without its newline that is no JSON object yet is a row being appended, and is left out."""
    try:
        text = Path(path).read_text()
        lines = text.splitlines()
    except (OSError, UnicodeDecodeError) as error:
        reason = _reason(error) if isinstance(error, OSError) else "not UTF-8 text"
        raise PathError(path, f"cannot be read ({reason})") from None
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            if number == len(lines) and not text.endswith("\n"):
                break  # a row still being appended (or cut off by a kill: a resume drops it)
            raise PathError(path, f"line {number} is not a JSON object")
        rows.append(row)
    return rows


def check_output_dir(parent: Path) -> None:
    """Refuse, before any work, an ``output.dir`` that is a file, lies under a file, or cannot be written."""
    existing = Path(parent)
    try:
        while not existing.exists():
            existing = existing.parent
    except OSError as error:
        raise ConfigError("output.dir", f"{parent} cannot be used ({_reason(error)})") from None
    if not existing.is_dir():
        raise ConfigError("output.dir", f"{existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError("output.dir", f"cannot create folders in {existing} (permission denied)")


def create_run_dir(parent: Path, name: str, config_yaml: str) -> Path:
    """Create ``parent/name`` (or ``name-2``, ``name-3``... if taken) holding ``config.yaml``, atomically.

    On failure nothing is left behind, not even the folders of ``parent`` this call created.
    """
    parent = Path(parent)
    missing = [folder for folder in (parent, *parent.parents) if not folder.exists()]
    staging: Path | None = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=parent))
        umask.share_folder(staging)
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
        raise ConfigError("output.name", f"no free run directory name for {name!r} in {parent}")
    except BaseException as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(error, OSError | PathError):
            reason = _reason(error) if isinstance(error, OSError) else str(error)
            raise ConfigError(
                "output.dir", f"cannot create the run directory in {parent} ({reason})"
            ) from None
        raise


def check_writable(run_dir: Path) -> None:
    """A one-line :class:`PathError` unless files can be created in ``run_dir`` (a probe, removed at once)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=".tmp", dir=run_dir)
    except OSError as error:
        raise PathError(run_dir, f"cannot be written ({_reason(error)})") from None
    os.close(fd)
    os.unlink(probe)


def remove_temporaries(run_dir: Path) -> list[Path]:
    """Delete the temporary files an interrupted write left in ``run_dir`` (and its plots); return them.

    :func:`atomic_write` names them ``.<file>.<random>.tmp`` beside the file it writes, so every such
    name is one, whichever file of the run was being written.
    """
    run_dir = Path(run_dir)
    stale = [*run_dir.glob(".*.tmp"), *(run_dir / PLOTS).glob(".*.tmp")]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class RunLock:
    """An exclusive lock on a run directory while one process runs it (``flock`` on the folder itself).

    The operating system drops it when the process ends, however it ends.
    """

    def __init__(self, run_dir: Path):
        self.fd: int | None = None
        try:
            fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:
            raise PathError(run_dir, f"cannot be opened ({_reason(error)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise PathError(run_dir, "is being run by another fedge process") from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.release()
