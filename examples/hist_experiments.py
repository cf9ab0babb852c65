"""HIST's experiments on CPU: Table I (per-client MB to a target accuracy), Fig. 7(a) (AirComp vs SNR) and
latency to a target accuracy with optimised vs uniform mask sizes (Fig. 6 / Eq. 19, Eq. 36).

    python examples/hist_experiments.py table1  [--rounds 30] [--cells 2 4] [--targets 0.7 0.8]
    python examples/hist_experiments.py aircomp [--rounds 15] [--snr -20 -10 10] [--steps 20]
    python examples/hist_experiments.py latency [--rounds 20] [--target 0.75]

Every run starts from ``examples/hist-fmnist.yaml`` or ``examples/hist-aircomp.yaml`` plus dotted
overrides (``--set key=value`` adds more, e.g. ``--set model.name=lenet5`` for the paper's Table I model),
stops once it has reached every target (or after ``--rounds``), and appends one JSON row per global round
to ``OUT/<run>.jsonl``; the summary table goes to ``OUT/<command>.md``. With ``--reuse`` a run whose rows
are already in its file is read, not rerun. Full scale: raise ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedge.algorithms.hierarchical.cells import Cells
from fedge.algorithms.hierarchical.config import RadioConfig
from fedge.algorithms.hierarchical.masks import partition_layout
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.config import load_config
from fedge.models import build_model, count_parameters
from fedge.runner import build_run
from fedge.system import aircomp_cost_per_value, greedy_sizes, oma_cost_per_value, size_cap, uniform_sizes
from fedge.system.partition_opt import round_latency

EXAMPLES = Path(__file__).parent
# HIST Table I (LeNet-5, H = 40, E = 5, fully non-i.i.d.): MB per client, (HIST, HFedAvg)
PAPER_TABLE_I = {
    (0.7, 2): (13.20, 23.66),
    (0.7, 4): (8.08, 20.28),
    (0.8, 2): (115.30, 206.18),
    (0.8, 4): (76.06, 246.74),
}


def train(
    config: Path, overrides: list[str], rounds: int, stop_at: float | None, out: Path, reuse: bool = False
) -> list[dict[str, Any]]:
    """Run global rounds until the accuracy reaches ``stop_at`` or ``rounds`` are done; one row per round.

    With ``reuse``, rows already in ``out`` that answer the request (they reach ``stop_at`` or run
    ``rounds`` rounds) are returned instead: runs are deterministic, so rerunning would repeat them.
    """
    if reuse and out.is_file():
        rows = [json.loads(line) for line in out.read_text().splitlines() if line]
        hit = next((i for i, r in enumerate(rows) if stop_at is not None and r["accuracy"] >= stop_at), None)
        if hit is not None or len(rows) >= rounds:
            print(f"{out.stem}: reusing {out}")
            return rows[: hit + 1] if hit is not None else rows[:rounds]
    cfg = load_config(config, [*overrides, f"rounds={rounds}"])
    built = build_run(cfg)
    clock = built.context.system.clock
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("")
    rows, began, cpu = [], time.perf_counter(), time.process_time()
    for t in range(1, rounds + 1):
        metrics = built.round(t).row()
        row = {"round": t, **built.evaluate(t).row(), **metrics, "sim_seconds": clock.seconds}
        row["wall_seconds"] = time.perf_counter() - began
        row["cpu_seconds"] = time.process_time() - cpu  # this process only (the machine may be shared)
        rows.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(
            f"{out.stem:32s} round {t:3d}  acc {100 * row['accuracy']:6.2f}%  "
            f"up/client {row['client_up_mb']:8.2f} MB  sim {row['sim_seconds']:8.2f} s  "
            f"cpu {row['cpu_seconds']:6.0f} s",
            flush=True,
        )
        if stop_at is not None and row["accuracy"] >= stop_at:
            break
    return rows


def first(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first row whose accuracy reaches ``target`` (no smoothing: the paper describes none)."""
    return next((r for r in rows if r["accuracy"] >= target), None)


def reached(rows: list[dict[str, Any]], target: float, key: str, unit: str) -> str:
    """``key`` at the first round reaching ``target``; otherwise how far the run got and, at the accuracy
    slope of its last 5 rounds, the round it would need (a linear extrapolation: curves flatten, so it is
    a lower bound)."""
    row = first(rows, target)
    if row is not None:
        return f"{row[key]:.2f}{unit} (round {row['round']})"
    last = rows[-1]
    text = f"not in {len(rows)} rounds (last {100 * last['accuracy']:.1f}%)"
    if len(rows) > 5 and last["accuracy"] > rows[-6]["accuracy"]:
        slope = (last["accuracy"] - rows[-6]["accuracy"]) / 5
        need = len(rows) + math.ceil((target - last["accuracy"]) / slope)
        text += f"; >= round {need}, >= {last[key] / len(rows) * need:.2f}{unit} projected"
    return text


def table1(args: argparse.Namespace) -> str:
    config = EXAMPLES / "hist-fmnist.yaml"
    runs = {}
    for cells in args.cells:
        for name in ("hist", "hfedavg"):
            label = f"table1-{name}-n{cells}"
            overrides = [f"algorithm.name={name}", f"algorithm.cells={cells}", *args.set]
            runs[(name, cells)] = train(
                config, overrides, args.rounds, max(args.targets), args.out / f"{label}.jsonl", args.reuse
            )
    lines = [
        "| target | N | HIST MB/client | HFedAvg MB/client | paper HIST | paper HFedAvg |",
        "|---|---|---|---|---|---|",
    ]
    for target in args.targets:
        for cells in args.cells:
            paper = [f"{v:.2f}" for v in PAPER_TABLE_I.get((target, cells), (float("nan"),) * 2)]
            hist = reached(runs[("hist", cells)], target, "client_up_mb", "")
            avg = reached(runs[("hfedavg", cells)], target, "client_up_mb", "")
            lines.append(f"| {100 * target:.0f}% | {cells} | {hist} | {avg} | {paper[0]} | {paper[1]} |")
    lines += ["", "| run | MB/client per global round | CPU s per global round |", "|---|---|---|"]
    for (name, cells), rows in runs.items():
        lines.append(
            f"| {name} N={cells} | {rows[0]['client_up_mb']:.4f} "
            f"| {rows[-1]['cpu_seconds'] / len(rows):.1f} |"
        )
    return "\n".join(lines)


def aircomp(args: argparse.Namespace) -> str:
    config = EXAMPLES / "hist-aircomp.yaml"
    base = [f"algorithm.local_steps={args.steps}", *args.set]
    runs = {
        "OMA-HIST": train(
            config,
            [*base, "algorithm.aggregation=oma"],
            args.rounds,
            None,
            args.out / "fig7a-oma.jsonl",
            args.reuse,
        )
    }
    for snr in args.snr:
        for norm in args.normalisation:
            label = f"AirComp-HIST {snr:+.0f} dB ({norm})"
            overrides = [
                *base,
                f"algorithm.radio.snr_db=[{snr}]",
                f"algorithm.radio.power_normalisation={norm}",
            ]
            runs[label] = train(
                config,
                overrides,
                args.rounds,
                None,
                args.out / f"fig7a-{snr:+.0f}dB-{norm}.jsonl",
                args.reuse,
            )
    tail = min(5, args.rounds)
    lines = [
        f"| run | acc. round 1 | acc. round {args.rounds // 2} | final acc. "
        f"| min / max acc. last {tail} rounds | mean per-element MSE |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in runs.items():
        last = [100 * r["accuracy"] for r in rows[-tail:]]
        mse = f"{sum(r['aircomp_mse'] for r in rows) / len(rows):.3g}" if "aircomp_mse" in rows[0] else "-"
        lines.append(
            f"| {label} | {100 * rows[0]['accuracy']:.2f}% "
            f"| {100 * rows[args.rounds // 2 - 1]['accuracy']:.2f}% "
            f"| {last[-1]:.2f}% | {min(last):.2f} / {max(last):.2f}% | {mse} |"
        )
    return "\n".join(lines)


def latency(args: argparse.Namespace) -> str:
    lines = [
        "| scheme | mask sizes | latency to target (simulated s) | mean latency per round (s) |",
        "|---|---|---|---|",
    ]
    schemes = [("OMA-HIST", EXAMPLES / "hist-fmnist.yaml", ["algorithm.cells=4"])]
    if args.aircomp_snr is not None:
        snr = f"algorithm.radio.snr_db=[{args.aircomp_snr}]"
        schemes.append((f"AirComp-HIST {args.aircomp_snr:+.0f} dB", EXAMPLES / "hist-aircomp.yaml", [snr]))
    for scheme, config, extra in schemes:
        for sizes in ("optimised", "uniform"):
            overrides = [
                *extra,
                f"algorithm.mask_sizes={sizes}",
                f"algorithm.local_steps={args.steps}",
                *args.set,
            ]
            label = f"latency-{scheme.split()[0].lower()}-{sizes}"
            rows = train(config, overrides, args.rounds, args.target, args.out / f"{label}.jsonl", args.reuse)
            per_round = rows[-1]["sim_seconds"] / len(rows)
            lines.append(
                f"| {scheme} | {sizes} | {reached(rows, args.target, 'sim_seconds', ' s')} "
                f"| {per_round:.3f} |"
            )
    return "\n".join(lines) + "\n\n" + model_latency(args)


def model_latency(args: argparse.Namespace, draws: int = 30) -> str:
    """Mean global-round latency of the system model alone (no training) over ``draws`` rounds of radio
    draws: FCNN, N = 4, E = 5, the default radio (Sec. VI-C), OMA and AirComp, uniform vs optimised sizes."""
    model = build_model("fcnn", (1, 28, 28), 10)
    (layer,) = partition_layout(model)
    d = count_parameters(model)
    shared, unit, units = d - layer.width * layer.values_per_neuron, layer.values_per_neuron, layer.width
    cells = Cells.even(60, 4)
    radio = CellRadio(RadioConfig(), cells, seed=1)
    members = [cells.members(j) for j in range(cells.num_cells)]
    lines = [
        f"| scheme (H = {args.steps}) | uniform (s) | optimised (s) | saving | HFedAvg (s) |",
        "|---|---|---|---|---|",
    ]
    for scheme in ("OMA", "AirComp"):
        uniform, optimised, full = [], [], []
        for t in range(1, draws + 1):
            cpu, rates = radio.cpu_hz(t), radio.oma_rates(t)
            if scheme == "OMA":
                costs = [oma_cost_per_value(5, args.steps, 1e6, d, cpu[m], rates[m]) for m in members]
            else:
                costs = [
                    aircomp_cost_per_value(5, args.steps, 1e6, d, cpu[m], 9e6, 15e3, 1 / 14e3)
                    for m in members
                ]
            best = greedy_sizes(np.array(costs), units, size_cap(units, 4), 1, shared, unit)
            uniform.append(round_latency(costs, uniform_sizes(units, 4), shared, unit))
            optimised.append(round_latency(costs, best, shared, unit))
            full.append(max(costs) * d)
        u, o = np.mean(uniform), np.mean(optimised)
        lines.append(f"| {scheme} | {u:.4f} | {o:.4f} | {100 * (1 - o / u):.1f}% | {np.mean(full):.4f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["table1", "aircomp", "latency"])
    parser.add_argument("--rounds", type=int, default=30, help="most global rounds per run")
    parser.add_argument("--cells", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--targets", type=float, nargs="+", default=[0.7, 0.8])
    parser.add_argument("--target", type=float, default=0.75, help="latency command: accuracy target")
    parser.add_argument("--snr", type=float, nargs="+", default=[-20.0, -10.0, 10.0])
    parser.add_argument("--normalisation", nargs="+", default=["paper"], choices=["paper", "tight"])
    parser.add_argument(
        "--aircomp-snr", type=float, default=None, help="latency command: also AirComp at this SNR"
    )
    parser.add_argument("--steps", type=int, default=20, help="local steps H (aircomp, latency commands)")
    parser.add_argument("--set", nargs="*", default=[], help="more dotted config overrides")
    parser.add_argument("--out", type=Path, default=Path("runs/hist-experiments"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="read runs whose OUT/<run>.jsonl already answer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = {"table1": table1, "aircomp": aircomp, "latency": latency}[args.command](args)
    (args.out / f"{args.command}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
