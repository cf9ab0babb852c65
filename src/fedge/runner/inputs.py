"""The contents of the files a run's config names, recorded at its start and checked when it resumes.

The config's digest (:func:`fedge.runner.checkpoint.config_digest`) covers its keys, not what the files they
name hold: a device-profile file edited, or a text corpus grown, after a run started would let a resume go
on with inputs neither the started run nor a fresh one had. So a run directory keeps ``inputs.json``: for
each key that names a local file or folder (``system.devices.file``, ``system.devices.trace``,
``data.root``, a ``data.tokenizer`` folder, a ``model.options.pretrained`` folder) the SHA-256 of every
file under it. A resume refuses, in one line naming the key and the file, when any of them changed, was
added or went; a run directory of an older fedge (no ``inputs.json``) is not checked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedge.config import RunConfig
from fedge.errors import ConfigError, PathError
from fedge.files import results

INPUTS = "inputs.json"


def named_paths(config: RunConfig) -> dict[str, Path]:
    """The local files and folders ``config`` names, by key (a hub name that is no path is left out)."""
    devices = config.system.devices
    candidates: dict[str, Any] = {
        "system.devices.file": devices.file if devices else None,
        "system.devices.trace": devices.trace if devices else None,
        "data.root": config.data.root,
        "data.tokenizer": config.data.tokenizer if config.data.tokenizer != "bytes" else None,
        "model.options.pretrained": config.model.options.get("pretrained"),
    }
    named = {}
    for key, value in candidates.items():
        if isinstance(value, str | Path) and Path(value).expanduser().exists():
            named[key] = Path(value).expanduser()
    return named


def _files(path: Path) -> list[Path]:
    """The regular files of ``path`` (itself, or every one under it, in a stable order)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def digests(config: RunConfig) -> dict[str, dict[str, Any]]:
    """For every path ``config`` names: the path and the SHA-256 of each regular file under it."""
    recorded = {}
    for key, path in named_paths(config).items():
        files = {str(p.relative_to(path)) if p != path else ".": _sha256(p) for p in _files(path)}
        recorded[key] = {"path": str(path.resolve()), "sha256": files}
    return recorded


def record(run_dir: Path, config: RunConfig) -> None:
    """Write ``inputs.json``: what the files ``config`` names hold as the run starts."""
    results.write_json(Path(run_dir) / INPUTS, digests(config))


def check(run_dir: Path, config: RunConfig) -> None:
    """Refuse (one :class:`~fedge.errors.ConfigError` naming the key and the file) to resume a run whose
    named files changed since it started."""
    path = Path(run_dir) / INPUTS
    if not path.is_file():
        return  # a run of an older fedge
    try:
        started = json.loads(path.read_text())
        if not isinstance(started, dict):
            raise ValueError
    except (OSError, ValueError):
        raise PathError(path, "cannot be read; it records what the run's input files held") from None
    now = digests(config)
    advice = "resume needs the inputs the run started with (restore it, or start a new run)"
    for key in sorted(set(started) | set(now)):
        before, after = started.get(key), now.get(key)
        if after is None:
            raise ConfigError(key, f"{started[key]['path']} is gone; {advice}")
        if before is None:
            raise ConfigError(key, f"{after['path']} was not there when the run started; {advice}")
        base = Path(after["path"])
        for name in sorted(set(before["sha256"]) | set(after["sha256"])):
            file = base if name == "." else base / name
            was, found = before["sha256"].get(name), after["sha256"].get(name)
            if was == found:
                continue
            state = "is gone" if found is None else "is new" if was is None else "changed"
            raise ConfigError(key, f"{file} {state} since the run started; {advice}")
