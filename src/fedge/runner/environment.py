"""``environment.json``: the versions, source commit, threads, device, executor and processes (world
size and collective backend) a run used, so it can be re-run; and what to do when the asked-for CUDA is
missing."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import torch

import fedge
from fedge.distributed import SINGLE, Group
from fedge.files import results

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


def describe(device: str, group: Group = SINGLE, executor: str | None = None) -> dict[str, Any]:
    """The software and host a run executes on, its processes (``fedge run --procs N``, torchrun) and the
    executor that trained it (what ``engine.executor: auto`` chose)."""
    return {
        "fedge": fedge.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "executor": executor,
        "world_size": group.size,
        "backend": torch.distributed.get_backend() if group.distributed else None,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "argv": sys.argv,
        "git": git_commit(Path(fedge.__file__).parent),
    }


def write_environment(run_dir: Path, device: str, group: Group = SINGLE, executor: str | None = None) -> None:
    """Write ``run_dir/environment.json`` (kept from the first session when a run is resumed)."""
    path = Path(run_dir) / ENVIRONMENT
    if not path.exists():
        results.write_json(path, describe(device, group, executor))


def cuda_missing() -> str:
    """Why ``engine.device=cuda`` cannot run here, and what to do about it."""
    if torch.version.cuda is None:
        return (
            f"CUDA was asked for but the installed torch {torch.__version__} is the CPU build; install a "
            "CUDA build (pip install --force-reinstall torch --index-url "
            "https://download.pytorch.org/whl/cuXYZ, the index for your driver's CUDA as "
            "https://pytorch.org/get-started/locally gives it) or set engine.device=cpu"
        )
    return (
        f"CUDA was asked for but torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees no "
        "GPU: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or set engine.device=cpu"
    )
