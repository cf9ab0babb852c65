"""Simulated time to a target accuracy on a heterogeneous fleet: synchronous, deadline and asynchronous.

Every run is ``async-digits.yaml`` (digits, 20 Dirichlet(0.5) clients, an MLP with 64 hidden units,
half the clients at work at a time; processors log-uniform over 10-100 MHz, a 10x compute spread, and
each client offline in 20 % of rounds) with one variant's overrides:

- ``sync``: FedAvg that waits for every selected (online) client;
- ``deadline``: the same with a 0.1 s round deadline, late clients dropped;
- ``partial``: a 0.06 s deadline, late clients sending the local steps they finished;
- ``fedbuff``: 10 clients in flight, the server aggregating every 5 arrivals;
- ``fedasync``: 10 clients in flight, every arrival mixed in (alpha 0.6, polynomial staleness 0.5);
- ``cse_fsl``: CSE-FSL (the MLP cut after its hidden layer, smashed data every h = 2 batches) on 10
  clients a round drawn among the online ones, its shared server serving in arrival order;
- ``cse_fsl_async``: asynchronous CSE-FSL, 10 clients at work, the client models merged every 5
  arrivals.

Writes ``results.json`` and ``table.md`` (mean and spread over seeds of the simulated seconds, rounds
and MB to each target) under ``--out``, with one run directory per variant and seed.

Usage: ``python examples/async_experiments.py [--seeds 0,1,2] [--variants sync,...] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import yaml

import fedge

CONFIG = Path(__file__).with_name("async-digits.yaml")
TARGETS = (0.8, 0.85)
VARIANTS: dict[str, list[str]] = {
    "sync": ["rounds=100"],
    "deadline": ["rounds=100", "algorithm.deadline_s=0.1"],
    "partial": ["rounds=100", "algorithm.deadline_s=0.06", "algorithm.late=partial"],
    "fedbuff": ["rounds=300", "algorithm.name=fedbuff", "algorithm.buffer_size=5"],
    "fedasync": ["rounds=800", "algorithm.name=fedasync"],
    "cse_fsl": ["rounds=100"],
    "cse_fsl_async": ["rounds=300", "algorithm.name=cse_fsl_async", "algorithm.buffer_size=5"],
}
CSE_FSL = {  # the split variants' algorithm block (FedAvg's local work, as CSE-FSL's knobs)
    "name": "cse_fsl",
    "participation": "without_replacement",
    "clients_per_round": 10,
    "local_epochs": 1,
    "batch_size": 32,
    "optimizer": {"lr": 0.05},
    "h": 2,
    "server_order": "arrival",
}


def base(variant: str) -> Path | dict[str, Any]:
    """The variant's config before its overrides: the example's, or with the split algorithm block."""
    if not variant.startswith("cse_fsl"):
        return CONFIG
    config = yaml.safe_load(CONFIG.read_text())
    config["model"]["cut"] = 1
    config["algorithm"] = dict(CSE_FSL)
    return config


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
    result = fedge.run(base(variant), overrides)
    reached = result.summary["time_to_target"]
    return {"variant": variant, "seed": seed, "rounds": len(result.metrics), "targets": reached}


def spread(values: list[float]) -> str:
    """``mean ± standard deviation`` (``-`` when a seed missed the target)."""
    if not values or any(v is None for v in values):
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.mean(values):.3g} ± {statistics.stdev(values):.2g}"


def table(rows: list[dict[str, Any]], variants: list[str]) -> str:
    """Markdown: per variant, the simulated seconds, rounds and MB to each target over seeds."""
    head = ["variant"] + [f"{label} to {t:g}" for t in TARGETS for label in ("sim s", "rounds", "MB")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in variants:
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
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("runs/async-experiments"))
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run(variant, seed, args.out / "runs") for variant in variants for seed in seeds]
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    text = table(rows, variants)
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
