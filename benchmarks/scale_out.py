"""Scale-out benchmark: one round of many clients on 1 rank against K gloo ranks (CPU).

A 10,000-client FedAvg round of an MLP on MNIST, 60 samples per client drawn with replacement from the
training set, one thread per rank: the round's wall time on one process and on ``--procs`` processes
(speed-up; the fastest of ``--rounds`` rounds of each), and each rank's peak resident memory against
the single process's (the stacked client state is split over the ranks; the dataset and torch itself
are not). ``--algorithm cse_fsl`` times a CSE-FSL round instead (the MLP cut after its hidden layer,
every client a participant, an upload every ``--h`` batches); its shared server steps on every rank.
Each rank's CPU time in the round is reported too (a waiting rank sleeps), which shows how the work
divides even where other jobs make the wall times noise. Each configuration runs in fresh child
processes, side by side in one invocation, and ``/proc/loadavg`` is recorded before and after (the
timings mean little on a busy machine).
``python -m benchmarks.scale_out [--clients N] [--procs K] [--algorithm cse_fsl]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SYNTHETIC = {"num_train": 60000, "num_test": 1000, "shape": [1, 28, 28], "num_classes": 10}  # MNIST-shaped


def config(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark run (the clients' samples are replaced after the build, see :func:`resample`)."""
    return {
        "seed": 0,
        "rounds": args.rounds,
        "data": {"name": args.dataset, **(SYNTHETIC if args.dataset == "synthetic" else {})},
        "partition": {"kind": "iid", "num_clients": args.clients},
        "model": {"name": "mlp", "options": {"hidden": [args.hidden]}, **split_cut(args)},
        "algorithm": algorithm(args),
        "engine": {"executor": "batched", "threads": 1, "dist_timeout": 600},
        "output": {"plots": False},
    }


def algorithm(args: argparse.Namespace) -> dict[str, Any]:
    """The timed algorithm's block: FedAvg, or CSE-FSL uploading every ``args.h`` batches."""
    block = {"name": args.algorithm, "batch_size": args.batch_size, "optimizer": {"lr": 0.05}}
    return {**block, "h": args.h} if args.algorithm == "cse_fsl" else block


def split_cut(args: argparse.Namespace) -> dict[str, Any]:
    """CSE-FSL's cut: after the hidden layer (FedAvg's model has none)."""
    return {"cut": 1} if args.algorithm == "cse_fsl" else {}


def checksum(value: Any) -> float:
    """The sum of every floating tensor of a (nested) algorithm state."""
    import torch

    if isinstance(value, torch.Tensor):
        return float(value.double().sum()) if value.is_floating_point() else 0.0
    if isinstance(value, dict):
        return sum(checksum(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(checksum(v) for v in value)
    return 0.0


def resample(data, samples: int, seed: int = 0) -> None:
    """Every client gets ``samples`` training indices drawn with replacement (same on every rank)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(data.y_train), size=(data.num_clients, samples))
    data.client_train = [np.sort(row) for row in draws]


def child(args: argparse.Namespace) -> None:
    """One rank (or the single process): build, resample, time one round, report as JSON on stdout."""
    import torch

    torch.set_num_threads(1)
    import fedge.algorithms  # noqa: F401  (the registry)
    from benchmarks.measure import peak_rss_bytes, reset_peak_rss
    from fedge.config import parse_config
    from fedge.runner.loop import build_run

    built = build_run(parse_config(config(args)), force=True)
    group = built.context.group
    resample(built.context.data, args.samples)
    built_peak = peak_rss_bytes()
    reset_peak_rss()  # from here on: the round's own peak
    times, cpu = [], []
    for t in range(1, args.rounds + 1):
        group.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        report = built.round(t)
        cpu.append(time.process_time() - start_cpu)
        group.barrier()
        times.append(time.perf_counter() - start)
    total = checksum(built.algorithm.state_dict())
    peaks = group.all_objects((max(built_peak, peak_rss_bytes()), peak_rss_bytes(), min(cpu)))
    if group.writes:
        figures = {
            "seconds": min(times),  # the least disturbed round
            "round_seconds": times,
            "peak_rss": [p[0] for p in peaks],  # the whole process: start-up, data and the round
            "round_peak_rss": [p[1] for p in peaks],  # during the round only
            "cpu_seconds": [p[2] for p in peaks],  # each rank's CPU time in its least costly round
            "train_loss": report.train_loss,
            "checksum": total,
        }
        print(json.dumps(figures))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, argv: list[str], timeout: float) -> dict[str, Any]:
    """Run the child on ``world`` ranks (plain process when 1) and return rank 0's report."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    ranks = [{}]
    if world > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
        ranks = [{"RANK": str(r), "LOCAL_RANK": str(r)} for r in range(world)]
    command = [sys.executable, "-m", "benchmarks.scale_out", "--child", *argv]
    procs = [
        subprocess.Popen(command, env={**env, **extra}, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for extra in ranks
    ]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"scale_out: a rank of the {world}-process run failed")
    return json.loads(outs[0].strip().splitlines()[-1])


def loadavg() -> str:
    path = Path("/proc/loadavg")
    return path.read_text().strip() if path.exists() else "n/a"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scale_out", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--clients", type=int, default=10000)
    parser.add_argument(
        "--samples", type=int, default=60, help="training samples per client (with replacement)"
    )
    parser.add_argument("--hidden", type=int, default=128, help="width of the MLP's hidden layer")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dataset", default="mnist", choices=("mnist", "synthetic"))
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--algorithm", default="fedavg", choices=("fedavg", "cse_fsl"))
    parser.add_argument("--h", type=int, default=1, help="cse_fsl: upload every h local batches")
    parser.add_argument("--rounds", type=int, default=2, help="rounds timed per configuration (min reported)")
    parser.add_argument("--timeout", type=float, default=280.0, help="seconds each configuration may take")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale-out-cpu.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--child"]
    return args, passed


def main(argv: list[str] | None = None) -> int:
    args, passed = parse_args(argv)
    if args.child:
        child(args)
        return 0
    before = loadavg()
    one = launch(1, passed, args.timeout)
    many = launch(args.procs, passed, args.timeout)
    report = {
        "workload": {
            k: getattr(args, k)
            for k in ("algorithm", "clients", "samples", "hidden", "batch_size", "dataset")
        },
        "threads_per_rank": 1,
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "single": one,
        f"ranks_{args.procs}": many,
        "speedup": one["seconds"] / many["seconds"],
        "peak_rss_ratio_per_rank": max(many["peak_rss"]) / one["peak_rss"][0],
        "round_peak_rss_ratio_per_rank": max(many["round_peak_rss"]) / one["round_peak_rss"][0],
        "cpu_ratio_per_rank": max(many["cpu_seconds"]) / one["cpu_seconds"][0],
        "checksum_difference": abs(one["checksum"] - many["checksum"]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    mib = [f"{b / 2**20:.0f}" for b in many["peak_rss"]]
    print(
        f"{args.algorithm}: {args.clients} clients x {args.samples} samples, MLP [{args.hidden}], "
        "1 thread per rank: "
        f"1 rank {one['seconds']:.2f} s, {args.procs} ranks {many['seconds']:.2f} s, "
        f"speed-up {report['speedup']:.2f}x; peak RSS per rank "
        f"{report['peak_rss_ratio_per_rank']:.2f}x of the single process "
        f"({one['peak_rss'][0] / 2**20:.0f} MiB -> {', '.join(mib)} MiB; round only "
        f"{report['round_peak_rss_ratio_per_rank']:.2f}x); CPU time per rank "
        f"{report['cpu_ratio_per_rank']:.2f}x; loadavg {before} -> {report['loadavg_after']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
