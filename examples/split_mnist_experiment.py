"""CSE-FSL against its baselines on MNIST: Table V's and Figs. 4, 6 and 9's claims at small scale.

Runs FSL_MC (splitfed_v1), FSL_OC (splitfed_v2), FSL_AN (fsl_an) and CSE-FSL with h = 1, 2, 4 on the
set-up of ``split-mnist.yaml`` (10,000 MNIST training images over 5 iid clients, LeNet-5 cut after the
conv blocks, B = 10, eta = 0.05) for the same number of epochs and several seeds, then prints:

- accuracy after equal epochs (mean +- sample std over seeds, ddof = 1: the paper's "±" is unspecified);
- communication in GiB without labels (Table V's convention) and the labels apart;
- server storage: parameters held, and the number of server-model copies (n for MC/AN, 1 for OC/CSE);
- accuracy at an equal communication budget (by default the label-free load of the cheapest CSE run),
  read at each run's last evaluated round within the budget;
- CSE's communication reduction against each baseline at equal epochs (baseline load / CSE load);
- the claims' accuracy differences paired by seed, with the 95 % t interval of the mean ("within noise"
  where it holds zero).

The runs are the sweep ``sweeps/split-mnist.yaml`` (``fedge sweep`` runs it alone: run directories,
``results.csv``, a table over seeds; rerunning continues an interrupted sweep). This script adds the
tables above, ``results.json`` and seed-averaged plots of accuracy against rounds and against GiB.
Usage: ``python examples/split_mnist_experiment.py [--seeds 0,1,2] [--rounds 8] [--dataset mnist]
[--jobs 2] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from fedge.config import load_raw
from fedge.experiments.sweep import load_sweep, paired_verdict, run_sweep
from fedge.files import results
from fedge.runner.plots import AXES, plot_runs
from fedge.runner.records import evaluated

BASE = Path(__file__).with_name("split-mnist.yaml")
SWEEP = Path(__file__).parent / "sweeps" / "split-mnist.yaml"
BASELINES = ("FSL_MC", "FSL_OC", "FSL_AN")
GIB_BITS = 8 * 2**30


def label_free_bits(row: dict[str, Any]) -> int:
    """Cumulative bits of a metrics row without the labels (CSE-FSL Table V counts no labels)."""
    by_kind = row["bits_by_kind"]
    return sum(by_kind.values()) - by_kind.get("labels_up", 0)


def run_variants(args: argparse.Namespace) -> dict[str, list[list[dict]]]:
    """Evaluated metric rows of every seed of every variant, from the sweep."""
    overrides = [f"rounds={args.rounds}", f"data.name={args.dataset}", f"output.dir={args.out}"]
    base, spec = load_sweep(SWEEP, overrides, seeds=args.seeds, jobs=args.jobs)
    outcome = run_sweep(
        base,
        spec,
        on_done=lambda task, done, total, eta: print(
            f"[{done}/{total}] {task.cell.label} seed {task.seed}", flush=True
        ),
    )
    runs: dict[str, list[list[dict]]] = {}
    for task in outcome.tasks:
        runs.setdefault(task.cell.group, []).append(
            evaluated(results.read_jsonl(task.run_dir / results.METRICS))
        )
    return runs


def at_budget(rows: list[dict[str, Any]], budget_bits: float) -> float | None:
    """Accuracy at the last evaluated round whose label-free load is within the budget."""
    within = [r for r in rows if label_free_bits(r) <= budget_bits]
    return within[-1]["accuracy"] if within else None


def epochs_within(rows: list[dict[str, Any]], budget_bits: float) -> int:
    """The last evaluated round within the budget (0 when even the first is over it)."""
    return max((r["round"] for r in rows if label_free_bits(r) <= budget_bits), default=0)


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(runs: dict[str, list[list[dict]]], budget_bits: float) -> dict[str, dict[str, Any]]:
    """One table row per variant."""
    table = {}
    for label, seeds in runs.items():
        last = [rows[-1] for rows in seeds]
        budget = [at_budget(rows, budget_bits) for rows in seeds]
        reached = [b for b in budget if b is not None]
        table[label] = {
            "accuracy": mean_std([r["accuracy"] for r in last]),
            "gib": statistics.fmean(label_free_bits(r) for r in last) / GIB_BITS,
            "labels_gib": statistics.fmean(r["bits_by_kind"].get("labels_up", 0) for r in last) / GIB_BITS,
            "server_mparams": last[0]["storage_server_bits"] / 32e6,
            "budget_accuracy": mean_std(reached) if len(reached) == len(budget) else None,
            "budget_round": statistics.fmean(epochs_within(rows, budget_bits) for rows in seeds),
        }
    return table


def print_table(table: dict[str, dict[str, Any]], copies: dict[str, int], budget_bits: float) -> None:
    print(f"\nequal epochs; budget = {budget_bits / GIB_BITS:.5f} GiB (label-free)")
    head = "| method | accuracy % (equal epochs) | comm. GiB | labels GiB | server M params (copies) |"
    print(head + " accuracy % at budget (epochs within) |")
    print("|---|---|---|---|---|---|")
    for label, row in table.items():
        acc = f"{100 * row['accuracy'][0]:.2f} ± {100 * row['accuracy'][1]:.2f}"
        budget = row["budget_accuracy"]
        at = f"{100 * budget[0]:.2f} ± {100 * budget[1]:.2f}" if budget else "no epoch within budget"
        print(
            f"| {label} | {acc} | {row['gib']:.5f} | {row['labels_gib']:.6f} | "
            f"{row['server_mparams']:.4f} ({copies[label]}) | {at} ({row['budget_round']:.0f}) |"
        )
    print("\nCSE communication reduction at equal epochs (baseline GiB / CSE GiB):")
    print("| CSE | " + " | ".join(f"vs {b}" for b in BASELINES) + " |")
    print("|---|" + "---|" * len(BASELINES))
    for label in (k for k in table if k.startswith("CSE")):
        ratios = " | ".join(f"{table[b]['gib'] / table[label]['gib']:.2f}x" for b in BASELINES)
        print(f"| {label} | {ratios} |")


# The claims tested by seed pairs: Table V's ordering at equal epochs, and Figs. 4 / 9's per-GB win.
EPOCH_PAIRS = [
    ("CSE h=1", "FSL_MC"),
    ("CSE h=1", "FSL_OC"),
    ("CSE h=1", "FSL_AN"),
    ("FSL_OC", "FSL_MC"),
    ("FSL_OC", "FSL_AN"),
    ("FSL_AN", "FSL_MC"),
    ("CSE h=2", "CSE h=1"),
    ("CSE h=4", "CSE h=1"),
    ("CSE h=4", "CSE h=2"),
]
BUDGET_PAIRS = [(cse, base) for cse in ("CSE h=1", "CSE h=2", "CSE h=4") for base in BASELINES]


def paired(runs: dict[str, list[list[dict]]], budget_bits: float) -> dict[str, dict[str, float]]:
    """Accuracy differences paired by seed (same seed: same split and initial model), in points: mean,
    95 % t interval, and whether it excludes zero, at equal epochs and at the budget."""
    out = {}
    for kind, pairs in (("equal epochs", EPOCH_PAIRS), ("equal budget", BUDGET_PAIRS)):
        for a, b in pairs:
            if a not in runs or b not in runs:
                continue
            if kind == "equal epochs":
                values = [
                    (x[-1]["accuracy"], y[-1]["accuracy"]) for x, y in zip(runs[a], runs[b], strict=True)
                ]
            else:
                values = [
                    (at_budget(x, budget_bits), at_budget(y, budget_bits))
                    for x, y in zip(runs[a], runs[b], strict=True)
                ]
            if any(v is None for pair in values for v in pair) or len(values) < 2:
                continue
            figures = paired_verdict([100 * (x - y) for x, y in values])
            out[f"{a} - {b}, {kind}"] = {k: figures[k] for k in ("mean", "low", "high", "verdict")}
    return out


def print_paired(pairs: dict[str, dict[str, float]]) -> None:
    print("\naccuracy differences paired by seed (points): mean [95 % interval]")
    print("| difference | mean [95 % interval] |\n|---|---|")
    for name, p in pairs.items():
        print(f"| {name} | {p['mean']:+.2f} [{p['low']:+.2f}, {p['high']:+.2f}] {p['verdict']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=lambda text: [int(s) for s in text.split(",")], default=None)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/split-mnist-experiment"))
    parser.add_argument("--budget-gib", type=float, default=None, help="default: the cheapest CSE run's load")
    args = parser.parse_args()
    runs = run_variants(args)
    loads = {
        label: statistics.fmean(label_free_bits(rows[-1]) for rows in seeds) for label, seeds in runs.items()
    }
    budget = (
        args.budget_gib * GIB_BITS if args.budget_gib else min(loads[k] for k in loads if k.startswith("CSE"))
    )
    table = summarize(runs, budget)
    clients = load_raw(BASE)["partition"]["num_clients"]
    cells = load_raw(SWEEP)["sweep"]["cells"]
    copies = {
        label: clients if cell["algorithm.name"] in ("splitfed_v1", "fsl_an") else 1
        for label, cell in cells.items()
    }
    print_table(table, copies, budget)
    pairs = paired(runs, budget)
    print_paired(pairs)
    curves = []
    for label, seeds in runs.items():
        rows = [
            {
                "round": seeds[0][i]["round"],
                "accuracy": statistics.fmean(s[i]["accuracy"] for s in seeds),
                "mb_total": statistics.fmean(label_free_bits(s[i]) for s in seeds) / (8 * 2**20),
            }
            for i in range(len(seeds[0]))
        ]
        curves.append((label, rows))
    axes = {
        "accuracy_vs_round": AXES["accuracy_vs_round"],
        "accuracy_vs_gib": ("mb_total", "communicated GiB, labels not counted (as CSE-FSL Table V)"),
    }
    plots = plot_runs(curves, args.out / "plots", axes=axes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"budget_bits": budget, "table": table, "paired": pairs}, indent=1)
    )
    print(f"\nwrote {args.out / 'results.json'} and {', '.join(str(p) for p in plots)}")


if __name__ == "__main__":
    main()
