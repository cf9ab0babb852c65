"""Results honour the umask (a group can read a shared report); environment.json says how the run was
placed; asking for CUDA on a CPU build of torch says so and how to install a CUDA one."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from tiers import parametrize_first_by_default

import fedge
from fedge.errors import ConfigError
from fedge.files import umask
from fedge.runner.loop import build_run


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def mask():
    """Set the process umask for a test, and put the old one back."""
    old = os.umask(0o022)
    yield lambda value: os.umask(value)
    os.umask(old)


@parametrize_first_by_default(
    ("value", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)]
)
def test_a_run_directory_and_its_files_follow_the_umask(tiny_config, mask, value, file_mode, folder_mode):
    mask(value)
    assert umask.current() == value
    tiny_config.update(rounds=2, output={**tiny_config["output"], "plots": True})
    run_dir = fedge.run(tiny_config).run_dir
    assert _mode(run_dir) == folder_mode and _mode(run_dir / "plots") == folder_mode
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"config.yaml", "metrics.jsonl", "summary.json", "environment.json", "checkpoint.pt"} <= {
        p.name for p in written
    }
    assert {p.name: _mode(p) for p in written} == {p.name: file_mode for p in written}


def test_environment_records_processes_and_device(tiny_config):
    tiny_config["rounds"] = 1
    environment = json.loads((fedge.run(tiny_config).run_dir / "environment.json").read_text())
    assert (environment["world_size"], environment["backend"], environment["device"]) == (1, None, "cpu")


def test_cuda_on_a_cpu_build_says_so_and_how_to_install_one(tiny_config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError) as caught:
        build_run(fedge.resolve_config(tiny_config, ["engine.device=cuda"]))
    message = str(caught.value)
    assert message.startswith("engine.device: ") and "\n" not in message
    assert f"torch {torch.__version__} is the CPU build" in message
    assert "download.pytorch.org/whl/cu" in message and "engine.device=cpu" in message
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    with pytest.raises(ConfigError, match="built for CUDA 12.6.*sees no GPU"):
        build_run(fedge.resolve_config(tiny_config, ["engine.device=cuda"]))
