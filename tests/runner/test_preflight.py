"""Memory pre-flight: available memory as the machine reports it, estimates that name their cause, and a
refusal before anything large is allocated."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cases import tiny

import fedge
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.runner import preflight
from fedge.runner.loop import build_run
from fedge.runner.preflight import Part


def test_available_memory_is_memavailable_lowered_to_the_cgroup_limit(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  32000000 kB\nMemAvailable:  2000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    monkeypatch.setattr(preflight, "MEMINFO", meminfo)
    monkeypatch.setattr(preflight, "CGROUP", cgroup)
    cpu = torch.device("cpu")
    assert preflight.available_bytes(cpu) == 2_000_000 * 1024  # no cgroup files: MemAvailable
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("5\n")
    assert preflight.available_bytes(cpu) == 2_000_000 * 1024
    (cgroup / "memory.max").write_text(f"{10**9}\n")
    (cgroup / "memory.current").write_text(f"{4 * 10**8}\n")
    assert preflight.available_bytes(cpu) == 6 * 10**8
    meminfo.unlink()
    (cgroup / "memory.max").unlink()
    assert preflight.available_bytes(cpu) is None  # nothing to go by: no check


def test_the_refusal_names_the_first_part_too_large_on_its_own():
    parts = [Part("data", 10, "d"), Part("model", 600, "a model"), Part("partition.num_clients", 900, "c")]
    with pytest.raises(
        ConfigError, match=r"^model: this run needs about 1.5 KiB .*a model: 600 B\) but 500 B"
    ):
        preflight.check(parts, 500, force=False)
    with pytest.raises(ConfigError, match="^partition.num_clients: "):  # none alone: the largest
        preflight.check(parts, 1200, force=False)
    preflight.check(parts, 1510, force=False)
    preflight.check(parts, 10, force=True)
    preflight.check(parts, None, force=False)


def test_estimates_follow_the_config(tmp_path):
    config = parse_config(tiny("fedavg", tmp_path))
    assert preflight.synthetic_data(config).bytes == (240 + 120) * (36 * 4 + 8)
    data = build_run(config).context.data
    values = 36 * 16 + 16 + 16 * 4 + 4
    parts = {part.key: part.bytes for part in preflight.state_parts(config, data)}
    assert parts["model"] == values * 2 * 4 and parts["partition.num_clients"] == values * 4 * 4
    momentum = parse_config(
        tiny("fedavg", tmp_path) | {"algorithm": {"name": "fedavg", "optimizer": {"momentum": 0.9}}}
    )
    assert {p.key: p.bytes for p in preflight.state_parts(momentum, data)}["model"] == values * 3 * 4


def test_a_huge_model_is_refused_before_it_is_built(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr("fedge.runner.loop.build_model", never)
    config = parse_config(
        tiny("fedavg", tmp_path) | {"model": {"name": "mlp", "options": {"hidden": [10**12]}}}
    )
    with pytest.raises(ConfigError, match="^model: this run needs about"):
        build_run(config)


def test_a_huge_synthetic_set_is_refused_before_it_is_drawn(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the data was drawn")

    monkeypatch.setattr("fedge.runner.loop.load_dataset", never)
    config = parse_config(tiny("fedavg", tmp_path) | {"data": {"name": "synthetic", "num_train": 10**14}})
    with pytest.raises(ConfigError, match=r"^data: this run needs about .* PiB"):
        build_run(config)


@pytest.mark.parametrize(
    ("algorithm", "key"),
    [("centralized", "epochs_per_round"), ("ditto", "personal_epochs"), ("gossip", "ft_epochs")],
)
def test_every_epochs_knob_counts_in_the_batch_plans(tmp_path, algorithm, key):
    config = parse_config(tiny(algorithm, tmp_path) | {"algorithm": {"name": algorithm, key: 10**15}})
    with pytest.raises(ConfigError, match=f"^algorithm.{key}: this run needs about .* PiB"):
        build_run(config)


ISSUE_RUN = [
    "data.name=synthetic",
    "data.num_train=20000000",
    "partition.kind=iid",
    "partition.num_clients=10000000",
]


def test_the_clients_are_counted_from_the_config_before_any_data_is_drawn(tmp_path, monkeypatch):
    """20M samples over 10M clients: 10M copies of the quickstart's MLP are refused from the config
    alone; no sample is drawn and nothing is partitioned."""

    def never(*args, **kwargs):
        raise AssertionError("data was built or partitioned")

    for name in ("load_dataset", "partition_train", "partition_test", "FederatedData"):
        monkeypatch.setattr(f"fedge.runner.loop.{name}", never)
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 64 * 2**30)
    config = fedge.resolve_config("example:quickstart", [*ISSUE_RUN, f"output.dir={tmp_path}"])
    needle = r"^partition.num_clients: this run needs about 567.7 GiB .*10,000,000 clients' models"
    with pytest.raises(ConfigError, match=needle):
        build_run(config)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.options.hidden=[1000000000]"], "model"),  # a named dataset's shape is known: 8x8 digits
        (["data.name=cifar100", "model.name=mlp", "partition.num_clients=1000000"], "partition.num_clients"),
        (["algorithm.local_epochs=1000000000000"], "algorithm.local_epochs"),
    ],
)
def test_every_part_the_config_fixes_is_counted_before_the_data_is_loaded(
    tmp_path, monkeypatch, overrides, key
):
    def never(*args, **kwargs):
        raise AssertionError("the data was loaded")

    monkeypatch.setattr("fedge.runner.loop.load_dataset", never)
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 64 * 2**30)
    config = fedge.resolve_config("example:quickstart", [*overrides, f"output.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=f"^{key}: this run needs about"):
        build_run(config)


def test_the_config_estimate_never_exceeds_the_exact_one(tmp_path):
    """What the config alone tells is a lower bound of what the loaded run needs, so it refuses nothing
    the later checks would let run."""
    for algorithm in ("fedavg", "centralized", "ditto", "hist", "splitfed_v1", "gossip"):
        config = parse_config(tiny(algorithm, tmp_path))
        data = build_run(config).context.data
        early = [part.bytes for part in preflight.config_parts(config)]
        exact = [part.bytes for part in preflight.state_parts(config, data)]
        assert len(early) == 4 and early[0] == preflight.synthetic_data(config).bytes
        assert all(0 < size <= full for size, full in zip(early[1:], exact[1:], strict=True)), algorithm


@pytest.mark.ci
def test_the_issue_command_is_refused_at_once(tmp_path):
    """The command of the report, end to end: one line and exit 2 within seconds of torch's start-up
    (timed beside it, as the machine's load slows both), no run directory, far from the minutes and
    gigabytes it took before."""
    command = [
        sys.executable,
        "-m",
        "fedge",
        "run",
        "example:quickstart",
        *ISSUE_RUN,
        f"output.dir={tmp_path}",
    ]
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import fedge.runner.loop"], check=True, timeout=60, env=_env())
    start_up = time.monotonic() - started
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=_env())
    took = time.monotonic() - started
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("error: partition.num_clients: this run needs about"), lines[0]
    assert took < 3 * start_up + 10 and not list(tmp_path.iterdir()), (took, start_up)


def _env() -> dict[str, str]:
    """This checkout's fedge first on the path of a child process."""
    src = str(Path(fedge.__file__).parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
