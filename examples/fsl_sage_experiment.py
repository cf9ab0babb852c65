"""FSL-SAGE against CSE-FSL and SplitFed v2 (FSL_OC) at an equal communication budget, over paired seeds.

The set-up is ``fsl-sage-fashion-mnist.yaml`` (Fashion-MNIST, 10,000 training images over 5 iid clients,
LeNet-5 cut after its conv blocks, a linear aux model, B = 10, Adam at 0.001 with each client's state
kept, the FSL-SAGE paper's optimizer); FSL-SAGE and CSE-FSL upload every h = 5 batches, FSL-SAGE aligns
every l = 10 rounds. FSL-SAGE and CSE-FSL run ``--rounds`` rounds; the budget is the least total traffic
(every ledger kind, labels included) that any of their runs reached, and SplitFed v2 runs just past it.
Each run's accuracy at the budget is that of its last evaluated round within it. Printed: each
algorithm's mean accuracy at the budget and the rounds it got, and FSL-SAGE minus each baseline per seed
with the mean difference and its 95 % t interval (same seed = same split, initialisation and batches).

Usage: ``python examples/fsl_sage_experiment.py [--seeds 0,1,2,3,4] [--rounds 20] [--out DIR] [--json F]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import fedge
from fedge.config import load_raw
from fedge.experiments.sweep import paired_text, paired_verdict

BASE = Path(__file__).with_name("fsl-sage-fashion-mnist.yaml")
MB_BITS = 8e6
ALGORITHMS = {
    "fsl_sage": {},
    "cse_fsl": {"h": 5},
    "splitfed_v2": {},
}


def run_one(algorithm: str, seed: int, rounds: int, out: Path) -> list[dict[str, Any]]:
    """Metric rows of one run (every round evaluated)."""
    raw = load_raw(BASE)
    block = {k: v for k, v in raw["algorithm"].items() if k not in ("name", "h", "align_every")}
    raw["algorithm"] = {"name": algorithm, **block, **ALGORITHMS[algorithm]}
    if algorithm == "fsl_sage":
        raw["algorithm"].update(h=5, align_every=10)
    raw.update(seed=seed, rounds=rounds)
    raw["output"] = {"dir": str(out), "name": f"{algorithm}-s{seed}", "plots": False}
    return fedge.run(raw, force=True).metrics


def total_mb(row: dict[str, Any]) -> float:
    return sum(row["bits_by_kind"].values()) / MB_BITS


def at_budget(rows: list[dict[str, Any]], budget: float) -> tuple[float, int]:
    """Accuracy and round of the last evaluated round within ``budget`` MB."""
    within = [r for r in rows if "accuracy" in r and total_mb(r) <= budget + 1e-9]
    return within[-1]["accuracy"], within[-1]["round"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("runs/fsl-sage"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {a: {s: run_one(a, s, args.rounds, args.out) for s in seeds} for a in ("fsl_sage", "cse_fsl")}
    budget = min(total_mb(rows[-1]) for by_seed in runs.values() for rows in by_seed.values())
    per_round = total_mb(run_one("splitfed_v2", seeds[0], 1, args.out / "probe")[-1])
    v2_rounds = math.floor(budget / per_round) + 1
    runs["splitfed_v2"] = {s: run_one("splitfed_v2", s, v2_rounds, args.out) for s in seeds}
    table = {a: {s: at_budget(rows, budget) for s, rows in by_seed.items()} for a, by_seed in runs.items()}
    print(f"budget: {budget:.2f} MB (all traffic, labels included); seeds {seeds}")
    print("| algorithm | rounds within budget | accuracy at budget (mean over seeds) |")
    print("|---|---|---|")
    for a, by_seed in table.items():
        accs, rnds = [v[0] for v in by_seed.values()], sorted({v[1] for v in by_seed.values()})
        span = f"{rnds[0]}" if len(rnds) == 1 else f"{rnds[0]}-{rnds[-1]}"
        print(f"| {a} | {span} | {100 * statistics.fmean(accs):.2f} |")
    out: dict[str, Any] = {"budget_mb": budget, "seeds": seeds, "accuracy": table, "differences": {}}
    for other in ("cse_fsl", "splitfed_v2"):
        diffs = [100 * (table["fsl_sage"][s][0] - table[other][s][0]) for s in seeds]
        v = paired_verdict(diffs)
        out["differences"][other] = {"per_seed": diffs, "mean": v["mean"], "ci95": [v["low"], v["high"]]}
        shown = ", ".join(f"{d:+.2f}" for d in diffs)
        print(f"fsl_sage - {other}: {shown}; mean {paired_text(diffs)} (points, 95 % t interval)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
