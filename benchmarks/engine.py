"""Benchmark of the client engine: one FedAvg round, side by side, on workloads W1-W3.

    python -m benchmarks.engine --workloads W1,W2,W3 --device cpu --out engine.json

For every workload, in one process and interleaved repeat by repeat (so load from other jobs hits every
column alike), it times a fedge FedAvg round with the batched executor and with the sequential one,
one epoch of plain PyTorch centralized training of the same model on the same samples and batch size,
and, when the ``flower`` extra is installed, a Flower 1.41 simulation round of the same FedAvg. It
reports medians, the ratios, the round's FLOPs against the machine's measured matmul peak, and (in a
child process, so other workloads do not pollute the figure) the peak resident memory of a batched
round against the size of the stacked client state plus the dataset. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.centralized import CentralizedEpoch
from benchmarks.measure import (
    RssSampler,
    flops_per_sample,
    load_average,
    machine,
    matmul_peak,
    median,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    timed,
)
from benchmarks.workloads import WORKLOADS, Workload, get_workload
from fedge.engine import BatchedExecutor, Executor, SequentialExecutor
from fedge.engine.host import available_cores, configure_host
from fedge.runner.loop import Built, build_run

ROOT = Path(__file__).resolve().parents[1]
PROBE_ROUNDS = 3  # rounds watched by the memory probe (fragmentation can show after the first)
Tensors = dict[str, torch.Tensor]


def _clone(tensors: Tensors) -> Tensors:
    return {k: v.detach().clone() for k, v in tensors.items()}


def _max_diff(a: Tensors, b: Tensors) -> float:
    return max(float((a[k].double().cpu() - b[k].double().cpu()).abs().max()) for k in a)


def flower_installed() -> bool:
    """Whether the optional Flower extra (flwr with Ray) is importable."""
    return importlib.util.find_spec("flwr") is not None and importlib.util.find_spec("ray") is not None


def _build(workload: Workload, args: argparse.Namespace) -> Built:
    config = workload.config(device=args.device, threads=args.threads, seed=args.seed)
    config.engine.retain_memory = args.allocator == "retain"
    return build_run(config)


def state_bytes(built: Built) -> int:
    """Bytes of the stacked client state of one round: every client's parameters, buffers, optimizer."""
    alg = built.algorithm
    per_client = [*alg.params.values(), *alg.buffers.values(), *alg.sgd.init(alg.params).values()]
    return built.context.data.num_clients * sum(t.numel() * t.element_size() for t in per_client)


def data_bytes(built: Built) -> int:
    data = built.context.data
    tensors = (data.x_train, data.y_train, data.x_test, data.y_test)
    return sum(t.numel() * t.element_size() for t in tensors)


def run_workload(workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Time every column of one workload; the figures as a JSON-ready dict."""
    built = _build(workload, args)
    alg, ctx = built.algorithm, built.context
    device = ctx.device
    initial = (_clone(alg.params), _clone(alg.buffers))
    executors: dict[str, Executor] = {"batched": BatchedExecutor(), "sequential": SequentialExecutor()}
    if args.compile:
        executors["batched_compiled"] = BatchedExecutor(compile_step=True, fused=False)
    if args.autograd:
        executors["batched_autograd"] = BatchedExecutor(fused=False)

    def fedavg_round(executor: Executor) -> Callable[[int], object]:
        def run(t: int) -> object:
            ctx.executor = executor
            return built.round(t)

        return run

    first: dict[str, float] = {}
    after_round_1: dict[str, Tensors] = {}
    for name, executor in executors.items():  # round 1 from the same weights: warm-up and agreement
        alg.load_state_dict({"params": _clone(initial[0]), "buffers": _clone(initial[1])})
        first[name] = timed(lambda executor=executor: fedavg_round(executor)(1), device)
        after_round_1[name] = _clone(alg.params)
    for _ in range(args.compile_warmup if args.compile else 0):
        fedavg_round(executors["batched_compiled"])(1)

    central = CentralizedEpoch(ctx.build_model().to(device), ctx.data, workload.batch_size, workload.lr)
    first["centralized"] = timed(lambda: central(0), device)
    columns: dict[str, tuple[Callable[[int], object], int]] = {
        **{name: (fedavg_round(executor), args.threads) for name, executor in executors.items()},
        "centralized": (central, args.threads),
    }
    if args.threads > 1:  # small per-step work can run faster (and steadier) on one thread
        columns["sequential_1_thread"] = (fedavg_round(executors["sequential"]), 1)
        columns["centralized_1_thread"] = (central, 1)
    samples: dict[str, list[float]] = {name: [] for name in columns}
    for r in range(args.repeats):
        for name, (fn, threads) in columns.items():
            torch.set_num_threads(threads)
            samples[name].append(timed(lambda fn=fn, r=r: fn(r + 2), device))
    torch.set_num_threads(args.threads)
    by_column = {name: median(values) for name, values in samples.items()}
    seconds = {name: by_column[name] for name in [*executors, "centralized"]}
    threads = {name: args.threads for name in seconds}
    for name in ("sequential", "centralized"):  # the faster thread setting of each baseline counts
        single = by_column.get(f"{name}_1_thread")
        if single is not None and single < seconds[name]:
            seconds[name], threads[name] = single, 1

    agreement = {"batched_vs_sequential": _max_diff(after_round_1["batched"], after_round_1["sequential"])}
    if args.flower:
        flower = _flower(workload, args, {**initial[0], **initial[1]})
        samples["flower"] = flower["round_seconds"][1:]
        first["flower"] = flower["round_seconds"][0]
        seconds["flower"] = median(samples["flower"])
        if flower["model_after_round_1"] is not None:
            flower_model = flower["model_after_round_1"]
            agreement["flower_vs_batched"] = _max_diff(after_round_1["batched"], flower_model)

    x, y = ctx.data.x_train[: workload.batch_size], ctx.data.y_train[: workload.batch_size]
    per_sample = flops_per_sample(ctx.build_model().to(device), x, y)
    total = int(ctx.data.client_sizes().sum()) * workload.local_epochs
    flops = {kind: per_sample[kind] * total for kind in per_sample}
    result = {
        "description": workload.description,
        "clients": workload.clients,
        "samples": total,
        "batch_size": workload.batch_size,
        "seconds": seconds,
        "threads": threads,
        "seconds_by_column": by_column,
        "first_round_seconds": first,
        "repeats_seconds": samples,
        "ratios": _ratios(seconds),
        "flops_per_round": flops,
        "achieved_gflops": {
            kind: {name: count / s / 1e9 for name, s in seconds.items() if s} for kind, count in flops.items()
        },
        "agreement_max_abs_after_round_1": agreement,
        "state_bytes": state_bytes(built),
        "data_bytes": data_bytes(built),
    }
    return result


def _ratios(seconds: dict[str, float | None]) -> dict[str, float]:
    """Batched against each other column (>1: batched is that many times faster)."""
    batched = seconds["batched"]
    ratios = {"batched_over_centralized": batched / seconds["centralized"]}
    for name in ("sequential", "flower"):
        if seconds.get(name):
            ratios[f"{name}_over_batched"] = seconds[name] / batched
    if seconds.get("batched_compiled"):
        ratios["compiled_over_centralized"] = seconds["batched_compiled"] / seconds["centralized"]
    if seconds.get("batched_autograd"):
        ratios["autograd_over_batched"] = seconds["batched_autograd"] / batched
    return ratios


def _flower(workload: Workload, args: argparse.Namespace, initial: Tensors) -> dict[str, Any]:
    from benchmarks.flower import run_flower  # optional extra: imported only when installed

    return run_flower(workload.name, initial, args.flower_rounds, args.device, args.threads, args.seed)


def memory_probe(workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    """Peak RSS of batched FedAvg rounds after a warm-up round (run in a fresh process).

    The peak is the larger of the kernel's counter (reset before the round where Linux allows) and
    an RSS sample taken every millisecond during the round.
    """
    built = _build(workload, args)
    built.round(1)
    process_peak = peak_rss_bytes()
    reset = reset_peak_rss()
    before = rss_bytes()
    cuda = built.context.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(built.context.device)
    with RssSampler() as sampler:
        for t in range(2, 2 + PROBE_ROUNDS):
            built.round(t)
    state, data = state_bytes(built), data_bytes(built)
    out = {
        "state_bytes": state,
        "data_bytes": data,
        "rss_before_round": before,
        "peak_rss_round": max(peak_rss_bytes(), sampler.peak),
        "peak_rss_is_round_only": reset,
        "peak_rss_load_and_warmup": process_peak,
    }
    out["peak_rss_over_state_plus_data"] = out["peak_rss_round"] / (state + data)
    if cuda:
        out["cuda_peak_allocated"] = torch.cuda.max_memory_allocated(built.context.device)
    return out


def _memory_in_child(workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.engine",
        "--probe-memory",
        workload.name,
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--allocator",
        args.allocator,
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def table(report: dict[str, Any]) -> str:
    """The report as two plain-text tables: times and ratios, then FLOPs and memory."""
    peak = report["matmul_peak_gflops"]
    lines = [
        f"{'':4} {'batched':>9} {'compiled':>9} {'autograd':>9} {'sequent.':>9} {'central.':>9} {'flower':>9}"
        f"   {'b/cent':>7} {'seq/b':>7} {'flwr/b':>7}   (seconds per round; ratios; sequential and"
        " centralized at the faster of 1 and --threads threads)"
    ]
    for name, w in report["workloads"].items():
        s, r = w["seconds"], w["ratios"]
        times = (
            s["batched"],
            s.get("batched_compiled"),
            s.get("batched_autograd"),
            s["sequential"],
            s["centralized"],
            s.get("flower"),
        )
        ratios = (
            r["batched_over_centralized"],
            r.get("sequential_over_batched"),
            r.get("flower_over_batched"),
        )
        lines.append(
            f"{name:4} "
            + " ".join(f"{_fmt(v):>9}" for v in times)
            + "   "
            + " ".join(f"{_fmt(v, 'x', 2):>7}" for v in ratios)
        )
    lines += [
        "",
        f"matmul peak {peak:.1f} GFLOP/s; batched round: GFLOP (executed / 3x forward), GFLOP/s (% of peak)",
    ]
    for name, w in report["workloads"].items():
        flops, achieved = w["flops_per_round"], w["achieved_gflops"]
        exe, model = achieved["executed"]["batched"], achieved["model"]["batched"]
        lines.append(
            f"{name:4} {flops['executed'] / 1e9:7.1f} / {flops['model'] / 1e9:5.1f} GFLOP"
            f"   executed {exe:6.1f} ({100 * exe / peak:4.1f} %)"
            f"   3x forward {model:6.1f} ({100 * model / peak:4.1f} %)"
        )
    memories = {name: w["memory"] for name, w in report["workloads"].items() if "memory" in w}
    if memories:
        lines += ["", "peak RSS of a batched round against stacked client state + dataset"]
    for name, m in memories.items():
        base = (m["state_bytes"] + m["data_bytes"]) / 2**20
        lines.append(
            f"{name:4} {m['peak_rss_round'] / 2**20:7.0f} MiB / {base:.0f} MiB"
            f" = {m['peak_rss_over_state_plus_data']:.2f}x   (state {m['state_bytes'] / 2**20:.0f} MiB)"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="W1,W2,W3", help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", type=Path, help="write the full report as JSON here")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per column (median reported)")
    parser.add_argument("--threads", type=int, default=available_cores(), help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="also time the batched step compiled")
    parser.add_argument(
        "--autograd", action="store_true", help="also time the batched step on vmapped autograd (fused off)"
    )
    parser.add_argument("--compile-warmup", type=int, default=2, help="extra compiled rounds before timing")
    parser.add_argument("--no-flower", dest="flower", action="store_false", help="skip the Flower column")
    parser.add_argument("--flower-rounds", type=int, default=4, help="Flower rounds (the first is not timed)")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the RSS probe")
    parser.add_argument(
        "--allocator",
        choices=("retain", "default"),
        default="retain",
        help="engine.retain_memory on (retain) or off (default glibc behaviour)",
    )
    parser.add_argument("--probe-memory", metavar="WORKLOAD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or args.flower_rounds < 2:
        parser.error("--repeats and --threads must be >= 1, --flower-rounds >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_host(args.threads, args.allocator == "retain" and args.device == "cpu")
    if args.probe_memory:
        print(json.dumps(memory_probe(get_workload(args.probe_memory), args)))
        return 0
    device = torch.device(args.device)
    args.flower = args.flower and flower_installed()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    workloads = [get_workload(n) for n in names]
    report: dict[str, Any] = {
        "machine": machine(device),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_average_before": load_average(),
        "matmul_peak_gflops": matmul_peak(device)["gflops"],
        "workloads": {},
    }
    if not args.flower:
        print("Flower column skipped (install the extra: pip install -e '.[flower]')", file=sys.stderr)
    for workload in workloads:
        print(f"running {workload.name}: {workload.description}", file=sys.stderr)
        result = run_workload(workload, args)
        if args.memory:
            result["memory"] = _memory_in_child(workload, args)
        report["workloads"][workload.name] = result
    report["load_average_after"] = load_average()
    print(table(report))
    print(f"load average before {report['load_average_before']}, after {report['load_average_after']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
