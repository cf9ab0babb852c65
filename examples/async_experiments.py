"""Simulated time to a target accuracy on a heterogeneous fleet: synchronous, deadline and asynchronous.

Every run is ``async-digits.yaml`` (digits, 20 Dirichlet(0.5) clients, an MLP with 64 hidden units,
half the clients at work at a time; processors log-uniform over 10-100 MHz, a 10x compute spread, and
each client offline in 20 % of rounds) with one variant's overrides:

- ``sync``: FedAvg that waits for every selected (online) client;
- ``deadline``: the same with a 0.1 s round deadline, late clients dropped;
- ``partial``: a 0.06 s deadline, late clients sending the local steps they finished;
- ``fedbuff``: 10 clients in flight, the server aggregating every 5 arrivals (FedBuff's defaults
  otherwise: each update weighted 1/K, staleness-scaled by 1/sqrt(1 + tau));
- ``fedasync``: 10 clients in flight, every arrival mixed in (FedAsync's defaults: alpha 0.6, polynomial
  staleness 0.5, proximal rho 0.005);
- ``cse_fsl``: CSE-FSL (the MLP cut after its hidden layer, smashed data every h = 2 batches) on 10
  clients a round drawn among the online ones, its shared server serving in arrival order;
- ``cse_fsl_async``: asynchronous CSE-FSL, 10 clients at work, the client models merged every 5
  arrivals.

Writes under ``--out``, with one run directory per variant and seed: ``results.json`` (one row per run,
rewritten after each, so a rerun skips the runs it has), ``table.md`` (mean and spread over seeds of the
simulated seconds, rounds and MB to each target), ``seeds.md`` (those figures seed by seed) and
``paired.md`` (each claim's pair, :data:`PAIRS`: the reference's seconds and MB to each target minus the
variant's, seed by seed, with the mean and its 95 % t interval, "within noise" where it holds zero).

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
from fedge.experiments.sweep import paired_text, paired_verdict

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
PAIRS = (  # (reference, variant): the docs' claims are about the reference minus the variant
    ("sync", "deadline"),
    ("sync", "partial"),
    ("sync", "fedbuff"),
    ("sync", "fedasync"),
    ("deadline", "partial"),
    ("cse_fsl", "cse_fsl_async"),
)
PAIRED_FIELDS = {"sim_seconds": "sim s", "mb_total": "MB"}
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


def seed_table(rows: list[dict[str, Any]], variants: list[str]) -> str:
    """Markdown: every run's simulated seconds, rounds and MB to each target (``-``: not reached)."""
    head = ["variant", "seed"] + [f"{label} to {t:g}" for t in TARGETS for label in ("sim s", "rounds", "MB")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sorted(
        (r for r in rows if r["variant"] in variants), key=lambda r: variants.index(r["variant"])
    ):
        cells = [row["variant"], str(row["seed"])]
        for target in TARGETS:
            hit = row["targets"].get(f"{target:g}")
            cells += [f"{hit[f]:.4g}" if hit else "-" for f in ("sim_seconds", "round", "mb_total")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each pair of :data:`PAIRS` with runs on both sides, each target and each of
    :data:`PAIRED_FIELDS`: the reference minus the variant, seed by seed (seeds where both reached the
    target), their mean and 95 % t interval."""
    by = {(r["variant"], r["seed"]): r["targets"] for r in rows}
    out = []
    for reference, variant in PAIRS:
        seeds = sorted(seed for name, seed in by if name == variant and (reference, seed) in by)
        if not seeds:
            continue
        for target in TARGETS:
            for field in PAIRED_FIELDS:
                both = [
                    s
                    for s in seeds
                    if by[reference, s].get(f"{target:g}") and by[variant, s].get(f"{target:g}")
                ]
                differences = [
                    by[reference, s][f"{target:g}"][field] - by[variant, s][f"{target:g}"][field]
                    for s in both
                ]
                out.append(
                    {
                        "reference": reference,
                        "variant": variant,
                        "target": target,
                        "field": field,
                        "seeds": both,
                        "differences": differences,
                        **paired_verdict(differences),
                        "text": paired_text(differences) if differences else "no seed reached it in both",
                    }
                )
    return out


def paired_table(pairs: list[dict[str, Any]]) -> str:
    """Markdown: one row per pair, target and figure, with the per-seed differences and the interval."""
    lines = [
        "| reference - variant | figure to target | per seed (seeds) | mean [95 % interval] |",
        "|---|---|---|---|",
    ]
    for p in pairs:
        per_seed = ", ".join(f"{d:+.3g}" for d in p["differences"])
        seeds = ",".join(map(str, p["seeds"]))
        figure = f"{PAIRED_FIELDS[p['field']]} to {p['target']:g}"
        lines.append(f"| {p['reference']} - {p['variant']} | {figure} | {per_seed} ({seeds}) | {p['text']} |")
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename (never half-written)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


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
    saved = args.out / "results.json"
    rows = json.loads(saved.read_text()) if saved.is_file() else []
    for variant in variants:
        for seed in seeds:
            if not any(r["variant"] == variant and r["seed"] == seed for r in rows):
                rows.append(run(variant, seed, args.out / "runs"))
                write(saved, json.dumps(rows, indent=2) + "\n")
    mine = [r for r in rows if r["variant"] in variants and r["seed"] in seeds]
    text = table(mine, variants)
    write(args.out / "table.md", text)
    write(args.out / "seeds.md", seed_table(mine, variants))
    pairs = paired(mine)
    write(args.out / "paired.md", paired_table(pairs))
    write(args.out / "paired.json", json.dumps(pairs, indent=2) + "\n")
    print(text + "\n" + paired_table(pairs))


if __name__ == "__main__":
    main()
