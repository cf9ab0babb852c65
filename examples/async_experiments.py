"""Simulated time to a target accuracy on a heterogeneous fleet: synchronous, deadline and asynchronous.

Every run is ``async-digits.yaml`` (digits, 20 Dirichlet(0.5) clients, an MLP with 64 hidden units,
half the clients at work at a time; processors log-uniform over 10-100 MHz, a 10x compute spread, and
each client offline in 20 % of rounds) with one variant's overrides:

- ``sync``: FedAvg that waits for every selected (online) client;
- ``deadline``: the same with a 0.1 s round deadline, late clients dropped;
- ``partial``: a 0.06 s deadline, late clients sending the local steps they finished;
- ``fedbuff``: 10 clients in flight, the server aggregating every 5 arrivals;
- ``fedasync``: 10 clients in flight, every arrival mixed in (alpha 0.6, polynomial staleness 0.5).

Writes ``results.json`` and ``table.md`` (mean and spread over seeds of the simulated seconds, rounds
and MB to each target) under ``--out``, with one run directory per variant and seed.

Usage: ``python examples/async_experiments.py [--seeds 0,1,2] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import fedge

CONFIG = Path(__file__).with_name("async-digits.yaml")
TARGETS = (0.8, 0.85)
VARIANTS: dict[str, list[str]] = {
    "sync": ["rounds=100"],
    "deadline": ["rounds=100", "algorithm.deadline_s=0.1"],
    "partial": ["rounds=100", "algorithm.deadline_s=0.06", "algorithm.late=partial"],
    "fedbuff": ["rounds=300", "algorithm.name=fedbuff", "algorithm.buffer_size=5"],
    "fedasync": ["rounds=800", "algorithm.name=fedasync"],
}


def run(variant: str, seed: int, out: Path) -> dict[str, Any]:
    """One run to the last target (or its round cap); the first round, seconds and MB at each target."""
    overrides = [
        *VARIANTS[variant],
        f"seed={seed}",
        f"output.dir={out}",
        f"output.name={variant}-{seed}",
        "output.checkpoint_every=100000",
        f"stop.target_accuracy={max(TARGETS)}",
        f"stop.targets=[{','.join(map(str, TARGETS))}]",
    ]
    result = fedge.run(CONFIG, overrides)
    reached = result.summary["time_to_target"]
    return {"variant": variant, "seed": seed, "rounds": len(result.metrics), "targets": reached}


def spread(values: list[float]) -> str:
    """``mean ± standard deviation`` (``-`` when a seed missed the target)."""
    if not values or any(v is None for v in values):
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.mean(values):.3g} ± {statistics.stdev(values):.2g}"


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per variant, the simulated seconds, rounds and MB to each target over seeds."""
    head = ["variant"] + [f"{label} to {t:g}" for t in TARGETS for label in ("sim s", "rounds", "MB")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        cells = [variant]
        for target in TARGETS:
            hit = [r["targets"].get(f"{target:g}") for r in mine]
            for field in ("sim_seconds", "round", "mb_total"):
                cells.append(spread([h[field] if h else None for h in hit]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("runs/async-experiments"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run(variant, seed, args.out / "runs") for variant in VARIANTS for seed in seeds]
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    text = table(rows)
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
