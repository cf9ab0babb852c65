"""Paired per-seed differences between one algorithm and the others of a finished (or partial) sweep.

A sweep's ``table.md`` gives each cell's mean and spread; with few seeds the spread of a difference is
better read from the pairs (same seed = same data split and initialisation). For every group of cells
that differ only in ``algorithm.name``, this prints the reference algorithm's accuracy minus each other
algorithm's, seed by seed, with their mean, sample std and the 95 % t interval of the mean (``within
noise`` where it holds zero), and AFIND+'s mean coreset size::

    python examples/paired.py runs/afind-factors --reference afind
    python examples/paired.py runs/afind-closest --reference afind --metric final_accuracy --json out.json
    python examples/paired.py runs/afind-factors-s7 runs/afind-factors-s8   # one sweep per seed list
    python examples/paired.py runs/afind-tau --reference afind-tau-0.1   # cells named <algorithm>-<variant>
    python examples/paired.py docs/results/afind-closest-s7.csv runs/afind-closest-s10   # a kept results.csv
    python examples/paired.py runs/afind-factors --versus-cell small   # how each cell moves the margins

``--versus-cell CELL`` adds, for every group ``OTHER, rest`` beside a group ``CELL, rest``, how much the
reference's margin over each algorithm moves from ``CELL`` to ``OTHER``, seed by seed (the margin in
``OTHER`` minus the margin in ``CELL`` on the same seed), with its interval: whether a factor moves a
margin is itself a paired test.

A ``.csv`` argument is a sweep's ``results.csv`` (its run directories need not exist; it has no neighbour
trace, so AFIND+'s coreset size averages the runs that have one). Only finished runs count, so it can be
read while a sweep is still running.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from fedge.experiments.sweep import finished_runs as sweep_finished_runs
from fedge.experiments.sweep import paired_verdict
from fedge.files import results
from fedge.runner.records import evaluated


def _group(label: str, name: str) -> tuple[str, str]:
    """A run's group (its cell label without the algorithm) and algorithm; a cell named after its
    algorithm and a variant ("afind-tau-0.1") is that variant."""
    parts = [p.strip() for p in label.split(",")]
    variant = next((p for p in parts if p.startswith(f"{name}-")), name)
    return ", ".join(p for p in parts if p not in (name, f"name={name}", variant)) or "all", variant


def finished_runs(sweep: Path) -> list[dict[str, Any]]:
    """Every finished run of ``sweep`` (a sweep directory, or its ``results.csv``): its group, algorithm,
    seed, summary figures and mean selected neighbours (AFIND+'s ``selected_mean``, None from a csv)."""
    if sweep.suffix == ".csv":
        return kept_runs(sweep)
    out = []
    for entry, run, summary in sweep_finished_runs(sweep):
        name = yaml.safe_load((run / results.CONFIG).read_text())["algorithm"]["name"]
        group, variant = _group(entry["label"], name)
        every = results.read_jsonl(run / results.METRICS)
        rows = evaluated(every)
        selected = [r["selected_mean"] for r in every if "selected_mean" in r]
        out.append(
            {
                "group": group,
                "algorithm": variant,
                "seed": int(entry["seed"]),
                "best_accuracy": max(r["accuracy"] for r in rows),
                "final_accuracy": rows[-1]["accuracy"],
                "rounds": summary.get("rounds"),
                "selected": statistics.fmean(selected) if selected else None,
            }
        )
    return out


def kept_runs(table: Path) -> list[dict[str, Any]]:
    """The runs of a sweep's ``results.csv`` (one row per finished run), as :func:`finished_runs` gives
    them."""
    with table.open() as handle:
        rows = list(csv.DictReader(handle))
    out = []
    for row in rows:
        group, variant = _group(row["label"], row["algorithm.name"])
        out.append(
            {
                "group": group,
                "algorithm": variant,
                "seed": int(row["seed"]),
                "best_accuracy": float(row["best_accuracy"]),
                "final_accuracy": float(row["final_accuracy"]),
                "rounds": int(row["rounds"]),
                "selected": None,
            }
        )
    return out


def paired(runs: list[dict[str, Any]], reference: str, metric: str) -> dict[str, Any]:
    """Per group: each algorithm's per-seed values, and the reference minus each other algorithm by seed."""
    table: dict[str, dict[str, dict[int, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in runs:
        table[r["group"]][r["algorithm"]][r["seed"]] = r
    out: dict[str, Any] = {}
    for group, algos in table.items():
        ref = algos.get(reference, {})
        entry: dict[str, Any] = {"values": {}, "differences": {}}
        for name, by_seed in algos.items():
            entry["values"][name] = {s: v[metric] for s, v in sorted(by_seed.items())}
            if name != reference:
                seeds = sorted(set(ref) & set(by_seed))
                entry["differences"][name] = {s: ref[s][metric] - by_seed[s][metric] for s in seeds}
        sizes = [v["selected"] for v in ref.values() if v["selected"] is not None]
        entry["afind_selected"] = statistics.fmean(sizes) if sizes else None
        out[group] = entry
    return out


def moved(result: dict[str, Any], baseline: str) -> list[tuple[str, str, dict[int, float]]]:
    """For every group ``OTHER, rest`` with a group ``baseline, rest``: each algorithm's margin (the
    reference minus it) in ``OTHER`` minus its margin in ``baseline``, by seed."""
    out = []
    for group, entry in result.items():
        cell, _, rest = group.partition(", ")
        base = result.get(", ".join(p for p in (baseline, rest) if p))
        if cell == baseline or base is None:
            continue
        for name, margins in entry["differences"].items():
            before = base["differences"].get(name, {})
            out.append((group, name, {s: margins[s] - before[s] for s in sorted(set(margins) & set(before))}))
    return out


def pm(values: list[float]) -> str:
    """Points (x100): mean ± sample std, or the single value."""
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    return f"{mean:+.2f} ± {100 * statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:+.2f}"


def verdict(values: list[float]) -> str:
    """The paired mean difference's 95 % t interval in points, and whether it excludes zero."""
    if len(values) < 2:
        return "-"
    v = paired_verdict([100 * d for d in values])
    return f"[{v['low']:+.2f}, {v['high']:+.2f}] {v['verdict']}"


def markdown(result: dict[str, Any], reference: str) -> str:
    lines = [
        f"| group | vs | {reference} - other, per seed (points) | mean ± std | 95 % interval"
        f" | {reference} neighbours a round |"
    ]
    lines.append("|---|---|---|---|---|---|")
    for group, entry in result.items():
        size = entry["afind_selected"]
        for name, diffs in entry["differences"].items():
            seeds = " / ".join(f"s{s}: {100 * d:+.2f}" for s, d in diffs.items())
            size_text = f"{size:.2f}" if size is not None else "-"
            values = list(diffs.values())
            lines.append(f"| {group} | {name} | {seeds} | {pm(values)} | {verdict(values)} | {size_text} |")
    lines += ["", "| group | algorithm | per seed (%) | mean |", "|---|---|---|---|"]
    for group, entry in result.items():
        for name, values in entry["values"].items():
            seeds = " / ".join(f"{100 * v:.2f}" for v in values.values())
            lines.append(f"| {group} | {name} | {seeds} | {100 * statistics.fmean(values.values()):.2f} |")
    return "\n".join(lines)


def moved_markdown(rows: list[tuple[str, str, dict[int, float]]], reference: str, baseline: str) -> str:
    lines = [
        f"| group | vs | {reference}'s margin here - in {baseline}, per seed (points) | mean ± std"
        " | 95 % interval |",
        "|---|---|---|---|---|",
    ]
    for group, name, shifts in rows:
        seeds = " / ".join(f"s{s}: {100 * d:+.2f}" for s, d in shifts.items())
        values = list(shifts.values())
        lines.append(f"| {group} | {name} | {seeds} | {pm(values)} | {verdict(values)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", type=Path, nargs="+", help="sweep directories (output.dir/NAME)")
    parser.add_argument("--reference", default="afind", help="the algorithm the others are compared with")
    parser.add_argument("--metric", default="best_accuracy", choices=["best_accuracy", "final_accuracy"])
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--versus-cell", help="also: how each cell moves the margins from this cell's")
    args = parser.parse_args()
    runs = [run for sweep in args.sweeps for run in finished_runs(sweep)]
    result = paired(runs, args.reference, args.metric)
    print(markdown(result, args.reference))
    if args.versus_cell:
        print("\n" + moved_markdown(moved(result, args.versus_cell), args.reference, args.versus_cell))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
