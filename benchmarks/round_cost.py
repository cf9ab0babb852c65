"""Seconds per round of a long, tiny ``fedge run``: the runner's own cost must not grow with the rounds.

    python -m benchmarks.round_cost                      # 10,000 rounds, marks at 1, 100, 1,000, 10,000
    python -m benchmarks.round_cost --rounds 1000 --out results/round-cost-cpu.json

The command line's ``fedge run`` runs in this process (``-q``) on FedAvg over digits, 2 clients, an MLP of
8 hidden units, evaluation only at the last round, a checkpoint after every round (the default
``output.checkpoint_every: 1``), one thread. Every checkpoint call is timed: the interval from one
round's checkpoint to the next is that round's seconds (training, its metrics row, the checkpoint), and
the call itself is what a checkpoint costs. Both are reported as wall and CPU seconds (this process's),
each the median over ``--window`` rounds from each mark (and the fastest round's wall seconds, the one
other jobs disturbed least): CPU seconds are what the code spends, wall seconds add the disk's ``fsync``
and other jobs on a shared machine. The run directory goes to
``/dev/shm`` where it exists, so the disk's speed does not hide the runner's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.measure import load_average, machine
from fedge.cli import commands as cli
from fedge.runner import loop as runner

MARKS = (1, 100, 1_000, 10_000)


def _overrides(rounds: int, out: Path) -> list[str]:
    return [
        f"rounds={rounds}",
        "partition.kind=iid",
        "partition.num_clients=2",
        "model.options.hidden=[8]",
        "algorithm.batch_size=64",
        f"eval.every={rounds}",
        "engine.threads=1",
        "output.plots=false",
        f"output.dir={out}",
    ]


def timed_run(rounds: int, out: Path) -> list[tuple[float, float, float, float]]:
    """``fedge run`` of the tiny config; per checkpoint call: wall and CPU seconds at its start and end."""
    stamps: list[tuple[float, float, float, float]] = []
    original = runner.Runner._checkpoint

    def checkpoint(self: runner.Runner, t: int, wall: float) -> None:
        began = time.perf_counter(), time.process_time()
        original(self, t, wall)
        stamps.append((*began, time.perf_counter(), time.process_time()))

    runner.Runner._checkpoint = checkpoint  # type: ignore[method-assign]
    try:
        cli.app(["run", *_overrides(rounds, out), "-q"], standalone_mode=False)
    finally:
        runner.Runner._checkpoint = original  # type: ignore[method-assign]
    return stamps


def per_round(stamps: list[tuple[float, float, float, float]], marks: list[int], window: int) -> dict:
    """Median seconds per round and per checkpoint (wall, CPU) over ``window`` rounds from each mark.

    Round ``t``'s seconds run from round ``t - 1``'s checkpoint to round ``t``'s (round 1 has none before
    it, so the first mark's window starts at round 2)."""
    report = {}
    for mark in marks:
        first = max(mark, 2)
        last = min(first + window, len(stamps) + 1)
        rounds = range(first, last)
        wall = [stamps[t - 1][0] - stamps[t - 2][0] for t in rounds]
        cpu = [stamps[t - 1][1] - stamps[t - 2][1] for t in rounds]
        ckpt_wall = [stamps[t - 1][2] - stamps[t - 1][0] for t in rounds]
        ckpt_cpu = [stamps[t - 1][3] - stamps[t - 1][1] for t in rounds]
        report[str(mark)] = {
            "rounds": [first, last - 1],
            "round_wall_s": statistics.median(wall),
            "round_wall_min_s": min(wall),
            "round_cpu_s": statistics.median(cpu),
            "checkpoint_wall_s": statistics.median(ckpt_wall),
            "checkpoint_cpu_s": statistics.median(ckpt_cpu),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.round_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=MARKS[-1])
    parser.add_argument("--window", type=int, default=20, help="rounds from each mark (median reported)")
    parser.add_argument("--dir", type=Path, help="where the run directory goes (default: /dev/shm or /tmp)")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    marks = [mark for mark in MARKS if mark <= args.rounds]
    if marks[-1] != args.rounds:
        marks.append(args.rounds)
    marks[-1] = max(2, args.rounds - args.window + 1)  # the last mark's window ends at the last round
    shm = Path("/dev/shm")
    base = args.dir or (shm if shm.is_dir() else None)
    report: dict[str, Any] = {"machine": machine(torch.device("cpu")), "settings": vars(args) | {"out": None}}
    report["settings"]["dir"] = str(base)
    report["load_average_before"] = load_average()
    with tempfile.TemporaryDirectory(prefix="fedge-round-cost-", dir=base) as folder:
        stamps = timed_run(args.rounds, Path(folder))
    report["load_average_after"] = load_average()
    report["marks"] = per_round(stamps, marks, args.window)
    walls = [m["round_wall_min_s"] for m in report["marks"].values()]
    cpus = [m["round_cpu_s"] for m in report["marks"].values()]
    report["largest_over_smallest"] = {"wall_min": max(walls) / min(walls), "cpu": max(cpus) / min(cpus)}
    head = ("rounds", "round wall s", "(fastest)", "round CPU s", "ckpt wall s", "ckpt CPU s")
    print(f"{head[0]:>13} {head[1]:>12} {head[2]:>9} {head[3]:>11} {head[4]:>11} {head[5]:>10}")
    for m in report["marks"].values():
        print(
            f"{m['rounds'][0]:>6}-{m['rounds'][1]:<6} {m['round_wall_s']:12.4f} {m['round_wall_min_s']:9.4f}"
            f" {m['round_cpu_s']:11.4f} {m['checkpoint_wall_s']:11.4f} {m['checkpoint_cpu_s']:10.4f}"
        )
    ratios = report["largest_over_smallest"]
    print(f"largest / smallest round: fastest wall {ratios['wall_min']:.2f}x, CPU {ratios['cpu']:.2f}x")
    print(f"load average before {report['load_average_before']}, after {report['load_average_after']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
