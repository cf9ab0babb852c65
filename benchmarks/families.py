"""Benchmark of the algorithm families against a hand-written PyTorch loop (W4-W7) and at population
scale (W8).

    python -m benchmarks.families --workloads W4,W5,W6,W7,W8 --out F.json
    python -m benchmarks.families --workloads W4 --clients 20 --repeats 2     # a quick look

For every algorithm of a workload, in one process and interleaved repeat by repeat (so load from other
jobs hits every column alike), it times one round of fedge with the batched executor, with the
sequential executor, and of a plain PyTorch loop of the same algorithm (:mod:`benchmarks.loops`: a
``nn.Module`` and ``torch.optim.SGD`` per client, same initial weights and batches). Round 1 of each
column runs from the same weights and their models are compared (agreement); the loop's round 1 is also
counted by ``torch.utils.flop_counter`` (the executed FLOPs). The timed columns run with glibc's default
allocator; a child process repeats the loop and batched columns with ``engine.retain_memory`` on.
W8 runs FedAvg and CSE-FSL on a population of 1,000,000 clients and of 1,000 clients with the same
cohort (:mod:`benchmarks.population`). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.loops import (
    AfindLoop,
    GossipLoop,
    HierarchicalLoop,
    HistLoop,
    SplitLoop,
    Tensors,
    fedge_bank_state,
    fedge_global_state,
    fedge_split_state,
)
from benchmarks.measure import load_average, machine, matmul_peak, median, timed
from fedge.api import resolve_config
from fedge.engine.host import configure_host
from fedge.runner.loop import Built, build_run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_PER_CLIENT = 600
TARGET_SPEEDUP = 3.0
CPU = torch.device("cpu")
PEAK_SHARE = 0.7

LENET_SPLIT = {"model": {"name": "lenet5", "cut": 2, "aux": {"kind": "linear"}}}


@dataclass(frozen=True)
class Entry:
    """One algorithm of a workload: its fedge config, its hand-written loop and how to read fedge's model."""

    algorithm: str
    raw: dict[str, Any]
    loop: Callable[[Built], Any] | None = None
    state: Callable[[Built], Tensors] | None = None


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    clients: int
    entries: tuple[Entry, ...] = field(default_factory=tuple)


def _split(name: str, **algorithm: Any) -> dict[str, Any]:
    return {
        **LENET_SPLIT,
        "algorithm": {"name": name, "batch_size": 32, "optimizer": {"lr": 0.05}, **algorithm},
    }


def _peer(name: str, **algorithm: Any) -> dict[str, Any]:
    return {
        "model": {"name": "mlp", "options": {"hidden": [200]}},
        "algorithm": {
            "name": name,
            "local_epochs": 1,
            "batch_size": 32,
            "optimizer": {"lr": 0.05, "momentum": 0.5},
            "ft_epochs": 0,
            "peers": 10,
            "topology": {"kind": "full"},
            **algorithm,
        },
    }


def _hierarchical(name: str, **algorithm: Any) -> dict[str, Any]:
    return {
        "model": {"name": "fcnn"},
        "algorithm": {
            "name": name,
            "cells": 4,
            "edge_rounds": 5,
            "local_steps": 20,
            "batch_size": 50,
            **algorithm,
        },
    }


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "W4",
            "CSE-FSL, 100 clients x 600 MNIST, LeNet-5 cut after the conv blocks, h = 2, batch 32",
            100,
            (Entry("cse_fsl", _split("cse_fsl", h=2), SplitLoop, fedge_split_state),),
        ),
        Family(
            "W5",
            "SplitFed v1, 100 clients x 600 MNIST, LeNet-5 cut after the conv blocks, batch 32",
            100,
            (Entry("splitfed_v1", _split("splitfed_v1"), SplitLoop, fedge_split_state),),
        ),
        Family(
            "W6",
            "AFIND+ and gossip, 100 clients x 600 MNIST, MLP 784-200-10, full graph, 1 local epoch, batch 32",
            100,
            (
                Entry("afind", _peer("afind", k0=10), AfindLoop, fedge_bank_state),
                Entry("gossip", _peer("gossip"), GossipLoop, fedge_bank_state),
            ),
        ),
        Family(
            "W7",
            "HIST (uniform and optimised sizes) and HFedAvg, 60 clients, FCNN 784-300-10, N = 4, E = 5,"
            " H = 20, batch 50",
            60,
            (
                Entry("hist", _hierarchical("hist"), HistLoop, fedge_global_state),
                Entry("hfedavg", _hierarchical("hfedavg"), HierarchicalLoop, fedge_global_state),
                # unequal cells (latency-optimal sizes): the masked step; no loop written for it
                Entry(
                    "hist_optimised", _hierarchical("hist", mask_sizes="optimised"), None, fedge_global_state
                ),
            ),
        ),
    )
}


def run_config(
    entry: Entry,
    clients: int,
    executor: str,
    retain: bool,
    seed: int,
    device: str = "cpu",
    fused: bool = True,
) -> Built:
    """Build the fedge run of ``entry`` with ``clients`` clients of 600 MNIST samples each."""
    engine = {"executor": executor, "threads": 1, "retain_memory": retain, "device": device, "fused": fused}
    raw = {
        "seed": seed,
        "data": {"name": "mnist", "train_limit": clients * SAMPLES_PER_CLIENT, "test_limit": 1000},
        "partition": {"kind": "iid", "num_clients": clients},
        "engine": engine,
        "output": {"plots": False},
        **entry.raw,
    }
    return build_run(resolve_config(raw, []))


def _max_diff(a: Tensors, b: Tensors) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def measure_entry(
    entry: Entry,
    clients: int,
    repeats: int,
    retain: bool,
    columns: tuple[str, ...],
    seed: int,
    device: torch.device = CPU,
):
    """Round times of ``columns`` (loop, batched, sequential, batched_autograd: the batched executor with
    ``engine.fused`` off), interleaved; agreement and FLOPs of round 1."""
    runs: dict[str, Any] = {}
    for name in columns:
        if name in ("batched", "sequential"):
            runs[name] = run_config(entry, clients, name, retain, seed, str(device))
        elif name == "batched_autograd":
            runs[name] = run_config(entry, clients, "batched", retain, seed, str(device), fused=False)
    if "loop" in columns:
        runs["loop"] = entry.loop(run_config(entry, clients, "batched", retain, seed, str(device)))

    def step(name: str) -> Callable[[int], object]:
        return runs[name].round

    first: dict[str, float] = {}
    flops = None
    for name in columns:
        if name == "loop":
            counter = FlopCounterMode(display=False)
            with counter:
                first[name] = timed(lambda name=name: step(name)(1), device)
            flops = counter.get_total_flops()
        else:
            first[name] = timed(lambda name=name: step(name)(1), device)
    agreement = {}
    if "batched" in runs and entry.state is not None:
        reference = entry.state(runs["batched"])
        if "loop" in runs:
            agreement["loop_vs_batched"] = _max_diff(reference, runs["loop"].state())
        if "sequential" in runs:
            sequential = entry.state(runs["sequential"])
            agreement["sequential_vs_batched"] = _max_diff(reference, sequential)
            if "loop" in runs:
                agreement["loop_vs_sequential"] = _max_diff(sequential, runs["loop"].state())
    samples: dict[str, list[float]] = {name: [] for name in columns}
    for r in range(repeats):
        for name in columns:
            samples[name].append(timed(lambda name=name, r=r: step(name)(r + 2), device))
    seconds = {name: median(values) for name, values in samples.items()}
    return {
        "seconds": seconds,
        "repeats_seconds": samples,
        "first_round_seconds": first,
        "agreement_max_abs_after_round_1": agreement,
        "executed_flops": flops,
    }


def _child(name: str, algorithm: str, args: argparse.Namespace) -> dict[str, Any]:
    """The loop and batched columns with the allocator switch on, measured in a fresh process."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.families",
        "--child",
        f"{name}:{algorithm}",
        "--clients",
        str(args.clients or FAMILIES[name].clients),
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_family(family: Family, args: argparse.Namespace, peak: float) -> dict[str, Any]:
    clients = args.clients or family.clients
    out: dict[str, Any] = {"description": family.description, "clients": clients, "algorithms": {}}
    for entry in family.entries:
        if args.algorithms and entry.algorithm not in args.algorithms:
            continue
        print(f"  {family.name} {entry.algorithm} ({clients} clients)", file=sys.stderr, flush=True)
        columns = ("loop", "batched", "sequential") if entry.loop else ("batched", "sequential")
        columns += ("batched_autograd",) if args.autograd else ()
        loads = [load_average()]
        device = torch.device(args.device)
        off = measure_entry(entry, clients, args.repeats, False, columns, args.seed, device)
        loads.append(load_average())
        switch = args.allocator_on and entry.loop and device.type == "cpu"  # glibc's allocator: CPU only
        on = _child(family.name, entry.algorithm, args) if switch else None
        loads.append(load_average())
        out["algorithms"][entry.algorithm] = summarize(off, on, peak) | {"load_average": loads}
    return out


def summarize(off: dict[str, Any], on: dict[str, Any] | None, peak: float) -> dict[str, Any]:
    """Speedups, FLOP rates and the target of one algorithm from its measurements."""
    s = off["seconds"]
    result: dict[str, Any] = {"allocator_off": off}
    loop, batched = s.get("loop"), s["batched"]
    flops = off["executed_flops"]
    if loop:
        result["speedup_vs_loop"] = loop / batched
        result["sequential_speedup_vs_loop"] = loop / s["sequential"]
        floor = flops / (PEAK_SHARE * peak * 1e9) if flops else 0.0
        result["target_seconds"] = max(loop / TARGET_SPEEDUP, floor)
        result["target_met"] = batched <= result["target_seconds"]
    result["sequential_over_batched"] = s["sequential"] / batched
    if "batched_autograd" in s:
        result["fused_speedup"] = s["batched_autograd"] / batched
    if flops:
        result["executed_gflop"] = flops / 1e9
        result["batched_fraction_of_peak"] = flops / batched / (peak * 1e9)
    if on is not None:
        result["allocator_on"] = on
        result["speedup_vs_loop_allocator_on"] = on["seconds"]["loop"] / on["seconds"]["batched"]
    return result


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'':4} {'algorithm':12} {'loop':>7} {'batched':>8} {'seq.':>7} {'x loop':>7} {'seq x':>6}"
        f" {'on: x':>6} {'%peak':>6} {'agree':>8}  target"
    ]
    population = []
    for name, fam in report["workloads"].items():
        for alg, r in fam.get("algorithms", {}).items():
            if "by_population" in r:
                population.append(
                    f"{name:4} {alg:12} round time {r['round_time_ratio']:.2f}x, peak RSS"
                    f" {r['peak_rss_ratio']:.2f}x at the largest population against the smallest"
                )
                continue
            s = r["allocator_off"]["seconds"]
            agreements = r["allocator_off"]["agreement_max_abs_after_round_1"].values()
            agree = f"{max(agreements):8.1e}" if agreements else "-"
            lines.append(
                f"{name:4} {alg:12} {_f(s.get('loop')):>7} {_f(s['batched']):>8} {_f(s['sequential']):>7}"
                f" {_f(r.get('speedup_vs_loop'), 'x'):>7} {_f(r.get('sequential_speedup_vs_loop'), 'x'):>6}"
                f" {_f(r.get('speedup_vs_loop_allocator_on'), 'x'):>6}"
                f" {_f(100 * r.get('batched_fraction_of_peak', 0.0), '', 1):>6} {agree:>8}  "
                + (
                    f"{'met' if r['target_met'] else 'missed'} (<= {_f(r['target_seconds'])} s)"
                    if "target_met" in r
                    else "no loop"
                )
                + (f"; fused {r['fused_speedup']:.2f}x autograd" if "fused_speedup" in r else "")
            )
    return "\n".join(lines + population)


def _f(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.families", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="W4,W5,W6,W7,W8", help="comma-separated: W4..W8")
    parser.add_argument("--out", type=Path, help="write the full report as JSON here")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds per column (median reported)")
    parser.add_argument("--clients", type=int, help="clients of W4-W7 (default: the issue's sizes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--algorithms",
        type=lambda text: text.split(","),
        help="only these algorithms of the workloads (e.g. gossip,hist)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (W4-W7; W8 runs on the CPU)")
    parser.add_argument(
        "--autograd", action="store_true", help="also time the batched executor with engine.fused off"
    )
    parser.add_argument(
        "--no-allocator-on", dest="allocator_on", action="store_false", help="skip the switch-on child"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or (args.clients is not None and args.clients < 2):
        parser.error("--repeats must be >= 1 and --clients >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.child:
        name, algorithm = args.child.split(":")
        entry = next(e for e in FAMILIES[name].entries if e.algorithm == algorithm)
        configure_host(1, retain_memory=True)
        result = measure_entry(entry, args.clients, args.repeats, True, ("loop", "batched"), args.seed)
        print(json.dumps(result))
        return 0
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES and n != "W8"]
    if unknown:
        print(f"unknown workload(s) {', '.join(unknown)}; known: W4, W5, W6, W7, W8", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    peak = matmul_peak(device)["gflops"]
    report: dict[str, Any] = {
        "machine": machine(device),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_average_before": load_average(),
        "matmul_peak_gflops": peak,
        "workloads": {},
    }
    for name in names:
        print(f"running {name}", file=sys.stderr, flush=True)
        if name == "W8":
            from benchmarks.population import run_population

            report["workloads"][name] = run_population(args)
        else:
            report["workloads"][name] = run_family(FAMILIES[name], args, peak)
    report["load_average_after"] = load_average()
    print(table(report))
    print(
        f"matmul peak {peak:.1f} GFLOP/s; load average before {report['load_average_before']},"
        f" after {report['load_average_after']}"
    )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
