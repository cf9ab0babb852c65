"""Where a batched FedAvg round spends its time: a torch.profiler table of one round.

    python -m benchmarks.profile W1 [--device cpu] [--threads N] [--rows 15]

Builds the workload's run, trains one warm-up round, then profiles the next round and prints the
operators sorted by their own time. docs/performance.md reads these tables.
"""

from __future__ import annotations

import argparse
import time

from torch.profiler import ProfilerActivity, profile

from benchmarks.measure import synchronize
from benchmarks.workloads import WORKLOADS, get_workload
from fedge.engine.host import available_cores
from fedge.runner.loop import build_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--rows", type=int, default=15, help="operators to list")
    args = parser.parse_args(argv)
    built = build_run(get_workload(args.workload).config(device=args.device, threads=args.threads))
    device = built.context.device
    built.round(1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        built.round(2)
        synchronize(device)
    seconds = time.perf_counter() - start
    print(f"{args.workload}: {seconds:.3f} s per round profiled, {device}, {args.threads} threads")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
