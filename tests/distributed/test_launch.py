"""``fedge run --procs K``: the launcher names the rank that failed first, and ranks die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import children
import pytest
from cases import tiny
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

import fedge
from fedge.distributed import launch
from fedge.errors import EXIT_BAD_INPUT, EXIT_PEER_LOST


def _env() -> dict[str, str]:
    src = str(Path(fedge.__file__).parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def _failure(rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file="")


def test_a_rank_that_lost_its_peer_is_not_the_one_that_failed_first():
    """Rank 1 killed, rank 0 then out on its broken collective or stopped by torchrun: the launcher names
    rank 1 (the cause), not rank 0 (its consequence)."""
    for consequence in (EXIT_PEER_LOST, -signal.SIGTERM):  # out on its own, or stopped by torchrun
        failures = {0: _failure(0, consequence), 1: _failure(1, -signal.SIGKILL)}
        assert launch.failure_line(failures, 2) == (
            "rank 1 of 2 failed first (killed by SIGKILL); the other ranks were stopped"
        )
    crashed = {0: _failure(0, EXIT_PEER_LOST), 2: _failure(2, EXIT_BAD_INPUT), 3: _failure(3, EXIT_PEER_LOST)}
    assert launch.failure_line(crashed, 4).startswith("rank 2 of 4 failed first (exit code 2)")
    alone = {1: _failure(1, EXIT_PEER_LOST)}  # a peer that hung: the timeout is all there is to say
    assert launch.failure_line(alone, 2).startswith("rank 1 of 2 failed first (exit code 4: it lost a peer)")


CHILD = """
import os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(grandchild.pid, flush=True)
time.sleep(120)
"""
GRANDCHILD = """
import pathlib, sys, time
from fedge.distributed.lifeline import die_with_parent
die_with_parent()
pathlib.Path(sys.argv[1]).touch()
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.ci
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_process_that_asked_to_die_with_its_parent_does(tmp_path):
    ready = tmp_path / "ready"
    command = [sys.executable, "-c", CHILD, GRANDCHILD, str(ready)]
    with children.started(command, stdout=subprocess.PIPE, text=True, env=_env()) as parent:
        grandchild = int(children.Lines(parent.stdout).next(timeout=60))
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():  # past its imports and its request
                if time.monotonic() > deadline or not _alive(grandchild):
                    children.fail(parent, "the grandchild never got ready")
                time.sleep(0.05)
            parent.send_signal(signal.SIGKILL)
            parent.wait(timeout=children.REAP)
            assert _gone_within([grandchild], 10)
        finally:
            if _alive(grandchild):
                os.kill(grandchild, signal.SIGKILL)


def _ranks(launcher: int) -> dict[int, int]:
    """Rank -> pid of the launcher's rank processes (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        rank = next((v[5:] for v in environ if v.startswith(b"RANK=")), None)
        if ppid == launcher and rank is not None:
            found[int(rank)] = int(entry.name)
    return found


READY_SECONDS = 180  # for both ranks' second round: generous, a busy machine once took 60 s


@contextmanager
def _started(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, dict[int, int]]]:
    """A long 2-rank run, once both ranks are past their second round; the launcher and both ranks are
    killed when the block ends."""
    cfg = tiny("fedavg", tmp_path / "runs", rounds=100000)
    cfg["output"].update(name="long", checkpoint_every=50)
    path = tmp_path / "run.json"
    tmp_path.mkdir(exist_ok=True)
    path.write_text(json.dumps(cfg))
    command = [sys.executable, "-m", "fedge", "run", str(path), "-q", "--procs", "2"]
    ranks: dict[int, int] = {}
    with children.started(command, stderr=subprocess.PIPE, text=True, env=_env()) as launcher:
        try:
            metrics = tmp_path / "runs" / "long" / "metrics.jsonl"
            deadline = time.monotonic() + READY_SECONDS
            while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
                if launcher.poll() is not None:
                    children.fail(launcher, f"exited with code {launcher.returncode} before round 2")
                if time.monotonic() > deadline:
                    children.fail(launcher, f"not at round 2 after {READY_SECONDS} s")
                time.sleep(0.05)
            ranks.update(_ranks(launcher.pid))
            assert sorted(ranks) == [0, 1], ranks
            yield launcher, ranks
        finally:
            for pid in ranks.values():
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.ci
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_two_real_ranks_rank_one_killed_then_the_launcher_killed(tmp_path):
    """Rank 1 SIGKILLed: the launcher exits 1 naming rank 1. Then a second run's launcher SIGKILLed:
    both its ranks are gone within seconds, no orphan left."""
    with _started(tmp_path / "one") as (launcher, ranks):
        os.kill(ranks[1], signal.SIGKILL)
        stderr = children.finish(launcher, timeout=60)[1]
        assert launcher.returncode == 1, stderr[-2000:]
        last = [line for line in stderr.splitlines() if line.startswith("error: distributed: rank")][-1]
        assert last.startswith("error: distributed: rank 1 of 2 failed first (killed by SIGKILL)"), stderr
    with _started(tmp_path / "two") as (launcher, ranks):
        launcher.send_signal(signal.SIGKILL)
        children.finish(launcher, timeout=30)
        assert _gone_within(list(ranks.values()), 10), ranks
