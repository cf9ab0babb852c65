"""SIGKILL and resume, one test per algorithm family (FedAvg has its own in test_runner.py, through the
command line): a run killed mid-way resumes from its safe checkpoint to metrics and a ledger identical to
an uninterrupted run's.

The killed runs are forked from the test process once it has run every family's uninterrupted reference
(so the children start warm: no interpreter start-up, no first-call set-up), all together in one module
fixture, one thread each.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import children
import pytest
from cases import tiny

import fedge

FAMILIES = {
    "split": ("cse_fsl", {"h": 2}),
    "light_fedsl": ("light_fedsl", {"agg_interval": 3}),
    "decentralized": ("afind", {"k0": 2}),
    "hierarchical": ("hist", {}),
}
ROUNDS = 16
KILL_AFTER = 3  # metric rows; checkpoints every 2 rounds, so rows after the last one are recomputed
WALL = ("wall_seconds",)


def family_config(family: str, out: Path, name: str) -> dict:
    algorithm, extra = FAMILIES[family]
    config = tiny(algorithm, out, rounds=ROUNDS)
    config["algorithm"].update(extra)
    config["output"].update(name=name, checkpoint_every=2)
    config["engine"] = {"threads": 1}
    return config


def _fork_run(config: dict) -> int:
    """A child process running ``config`` (it never returns into the test session)."""
    pid = os.fork()
    if pid == 0:
        try:
            fedge.run(config)
        finally:
            os._exit(0)
    return pid


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict[str, tuple[Path, fedge.Result]]:
    """Every family's uninterrupted result, and its run directory after a SIGKILL some rounds in."""
    root = tmp_path_factory.mktemp("killed")
    references = {family: fedge.run(family_config(family, root / "reference", family)) for family in FAMILIES}
    run_dirs = {family: root / "runs" / family for family in FAMILIES}
    pids = {family: _fork_run(family_config(family, root / "runs", family)) for family in FAMILIES}
    deadline = time.monotonic() + 120
    while pids and time.monotonic() < deadline:
        for family, pid in list(pids.items()):
            metrics = run_dirs[family] / "metrics.jsonl"
            rows = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
            if rows >= KILL_AFTER or os.waitpid(pid, os.WNOHANG) != (0, 0):
                os.kill(pid, signal.SIGKILL)
                children.reap(pid)
                del pids[family]
        time.sleep(0.002)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
        children.reap(pid)
    return {family: (run_dirs[family], references[family]) for family in FAMILIES}


@pytest.mark.ci
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_killed_run_resumes_to_the_uninterrupted_result(killed, family):
    run_dir, reference = killed[family]
    assert not (run_dir / "summary.json").exists(), "the run finished before it could be killed"
    resumed = fedge.resume(run_dir)
    strip = [
        [{k: v for k, v in row.items() if k not in WALL} for row in r.metrics] for r in (resumed, reference)
    ]
    assert len(strip[0]) == ROUNDS and strip[0] == strip[1]
    assert (run_dir / "ledger.csv").read_bytes() == (reference.run_dir / "ledger.csv").read_bytes()


MATRIX_ALGORITHMS = ("fedavg", "cse_fsl", "splitfed_v2", "light_fedsl", "afind", "gossip", "hist")


def _temporaries(run_dir: Path) -> list[Path]:
    return [*run_dir.glob(".*.tmp"), *run_dir.glob("plots/.*.tmp")]


MOMENTS = {
    "before the first checkpoint": lambda d: d.is_dir() and not (d / "checkpoint.pt").exists(),
    "mid-run": lambda d: (
        (d / "metrics.jsonl").is_file() and len((d / "metrics.jsonl").read_text().splitlines()) >= ROUNDS // 2
    ),
    "right after a checkpoint": lambda d: (d / "checkpoint.pt").exists(),
    "during a write": lambda d: d.is_dir() and bool(_temporaries(d)),
}


ATTEMPTS = 5


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", MATRIX_ALGORITHMS)
def test_kill_matrix_every_moment_resumes_bit_identically(tmp_path, algorithm):
    """Seven algorithms killed at four moments each: all 28 resume to the uninterrupted metrics and ledger."""
    config = tiny(algorithm, tmp_path / "reference", rounds=ROUNDS)
    config["output"].update(checkpoint_every=1)
    config["engine"] = {"threads": 1}
    reference = fedge.run(config)
    missed, torn = [], []
    for moment, reached in MOMENTS.items():
        name = moment.replace(" ", "-")
        killed = {**config, "output": {**config["output"], "dir": str(tmp_path / "killed"), "name": name}}
        run_dir = tmp_path / "killed" / name
        for _ in range(ATTEMPTS):  # a write is short: under load the kill may land after its rename
            shutil.rmtree(run_dir, ignore_errors=True)
            pid = _fork_run(killed)
            deadline = time.monotonic() + 120
            while os.waitpid(pid, os.WNOHANG) == (0, 0) and not reached(run_dir):
                assert time.monotonic() < deadline, f"{moment}: not reached in 120 s"
            os.kill(pid, signal.SIGKILL)
            children.reap(pid)
            if moment != "during a write" or _temporaries(run_dir):
                break
        if (run_dir / "summary.json").exists():
            missed.append(moment)
            continue
        if moment == "during a write":
            torn.append(bool(_temporaries(run_dir)))
        resumed = fedge.resume(run_dir)
        strip = [
            [{k: v for k, v in r.items() if k not in WALL} for r in x.metrics] for x in (resumed, reference)
        ]
        assert strip[0] == strip[1], moment
        assert (run_dir / "ledger.csv").read_bytes() == (reference.run_dir / "ledger.csv").read_bytes(), (
            moment
        )
        assert not _temporaries(run_dir), moment
    assert not missed, f"runs finished before the kill: {missed}"
    assert torn == [True], "the kill did not leave a half-written temporary file"
