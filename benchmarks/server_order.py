"""Which executor is faster for each shared-server order of the split family: batched against sequential.

    python -m benchmarks.server_order --out results/server-order-cpu.json
    python -m benchmarks.server_order --algorithms cse_fsl --orders client_after_client --repeats 3

For CSE-FSL (h = 2) and SplitFed v2 on MNIST, LeNet-5 cut after its conv blocks, 5 clients of 600
samples, batch 32, one thread, it times one round with each executor, interleaved repeat by repeat (load
from other jobs hits both columns alike), after an untimed first round, and reports the ratio
batched / sequential (above 1: the sequential executor is faster) and how far apart the two models are
after round 1. ``client_after_client`` runs each client's whole local run in turn, so the batched
executor maps one client at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.families import Entry, _split, measure_entry
from benchmarks.loops import fedge_split_state
from benchmarks.measure import load_average, machine

ALGORITHMS = {"cse_fsl": {"h": 2}, "splitfed_v2": {}}
ORDERS = ("round_robin", "client_after_client")


def measure(algorithm: str, order: str, clients: int, repeats: int, seed: int) -> dict[str, Any]:
    """Round seconds of both executors (median of ``repeats``), their ratio and round-1 agreement."""
    entry = Entry(
        algorithm, _split(algorithm, server_order=order, **ALGORITHMS[algorithm]), None, fedge_split_state
    )
    result = measure_entry(entry, clients, repeats, False, ("batched", "sequential"), seed)
    seconds = result["seconds"]
    result["batched_over_sequential"] = seconds["batched"] / seconds["sequential"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.server_order", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--algorithms", default=",".join(ALGORITHMS), help="comma-separated: cse_fsl, splitfed_v2"
    )
    parser.add_argument("--orders", default=",".join(ORDERS), help="comma-separated server orders")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per column (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report: dict[str, Any] = {"machine": machine(torch.device("cpu")), "settings": vars(args) | {"out": None}}
    report["load_average_before"] = load_average()
    report["runs"] = {}
    print(f"{'algorithm':12} {'server order':20} {'batched s':>9} {'seq. s':>7} {'b / s':>6} {'agree':>8}")
    for algorithm in args.algorithms.split(","):
        for order in args.orders.split(","):
            print(f"  {algorithm} {order}", file=sys.stderr, flush=True)
            r = measure(algorithm, order, args.clients, args.repeats, args.seed)
            report["runs"][f"{algorithm}/{order}"] = r
            agree = max(r["agreement_max_abs_after_round_1"].values())
            s = r["seconds"]
            print(
                f"{algorithm:12} {order:20} {s['batched']:9.2f} {s['sequential']:7.2f}"
                f" {r['batched_over_sequential']:6.2f} {agree:8.1e}"
            )
    report["load_average_after"] = load_average()
    print(f"load average before {report['load_average_before']}, after {report['load_average_after']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
