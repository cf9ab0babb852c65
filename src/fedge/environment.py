"""``environment.json``: the versions, source commit, threads and device a run used, so it can be re-run."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import torch

import fedge
from fedge import results

ENVIRONMENT = "environment.json"


def git_commit(path: Path) -> dict[str, Any] | None:
    """The commit of the git checkout holding ``path`` and whether it has uncommitted changes, if any."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, timeout=5, check=True
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def describe(device: str) -> dict[str, Any]:
    """The software and host a run executes on."""
    return {
        "fedge": fedge.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "argv": sys.argv,
        "git": git_commit(Path(fedge.__file__).parent),
    }


def write_environment(run_dir: Path, device: str) -> None:
    """Write ``run_dir/environment.json`` (kept from the first session when a run is resumed)."""
    path = Path(run_dir) / ENVIRONMENT
    if not path.exists():
        results.write_json(path, describe(device))
