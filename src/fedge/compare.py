"""Side-by-side comparison: several algorithms on one config, over several seeds, as one table.

Each algorithm gets the base config with its ``algorithm`` block re-targeted: of the keys the user set,
those its own config class knows are kept and the rest dropped (and reported); every other key takes
that algorithm's own default, and ``name`` is set. Seeds are
``seed, seed + 1, ...``. Results land in ``output.dir/compare-<name>/<algorithm>-s<seed>/`` next to
``comparison.json`` and plots of the seed-averaged curves.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedge import results
from fedge.config import AlgorithmConfig, RunConfig, parse_config
from fedge.errors import ConfigError
from fedge.plots import AXES, GIB_AXIS, plot_runs
from fedge.runner import Result, start_run

BITS_PER_GIB = 8 * 2**30
BITS_PER_MPARAM = 32 * 1e6


@dataclass
class Comparison:
    """Every run of a comparison, the table rows and where they were written."""

    out_dir: Path
    runs: dict[str, list[Result]]
    rows: list[dict[str, Any]]
    dropped: dict[str, list[str]]


def retarget(config: RunConfig, name: str) -> tuple[RunConfig, list[str]]:
    """``config`` with its algorithm block moved to algorithm ``name``; also the keys that did not fit."""
    known = AlgorithmConfig.registry
    if name not in known:
        raise ConfigError("--algorithms", f"unknown algorithm {name!r}; known: {', '.join(sorted(known))}")
    fields = known[name].model_fields
    block = config.algorithm.model_dump(mode="json", exclude={"name"}, exclude_unset=True)
    kept = {k: v for k, v in block.items() if k in fields}
    raw = config.model_dump(mode="json")
    raw["algorithm"] = {**kept, "name": name}
    return parse_config(raw), sorted(set(block) - set(kept))


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _row(name: str, runs: list[Result]) -> dict[str, Any]:
    """One table row: accuracy mean and std over seeds, communication, storage."""
    summaries = [r.summary for r in runs]
    final = _mean_std([s["final_accuracy"] for s in summaries])
    best = _mean_std([s["best_accuracy"] for s in summaries])
    bits = [s["bits_up"] + s["bits_down"] + s["bits_peer"] for s in summaries]
    labels = [r.metrics[-1]["bits_by_kind"].get("labels_up", 0) for r in runs]
    return {
        "algorithm": name,
        "seeds": len(runs),
        "final_accuracy_mean": final[0],
        "final_accuracy_std": final[1],
        "best_accuracy_mean": best[0],
        "best_accuracy_std": best[1],
        "communication_gib": statistics.fmean(bits) / BITS_PER_GIB,
        "labels_gib": statistics.fmean(labels) / BITS_PER_GIB,  # of communication_gib (split learning)
        "server_storage_mparams": summaries[0]["storage_server_bits"] / BITS_PER_MPARAM,
        "client_storage_mparams": summaries[0]["storage_client_bits"] / BITS_PER_MPARAM,
        "sim_seconds_mean": statistics.fmean(s["sim_seconds"] for s in summaries),
        "sim_joules_mean": statistics.fmean(s["sim_joules"] for s in summaries),
        "wall_seconds_mean": statistics.fmean(s["wall_seconds"] for s in summaries),
    }


def _mean_curve(runs: list[Result]) -> list[dict[str, float]]:
    """Seed-averaged accuracy and communication per evaluated round (rounds common to all seeds)."""
    length = min(len(r.metrics) for r in runs)
    return [
        {
            key: statistics.fmean(r.metrics[i][key] for r in runs)
            for key in ("round", "accuracy", "mb_total", "sim_seconds")
        }
        for i in range(length)
    ]


def compare(config: RunConfig, algorithms: list[str], seeds: int = 1, on_run=None) -> Comparison:
    """Run every algorithm of ``algorithms`` on ``config`` for ``seeds`` seeds and tabulate them."""
    if seeds < 1:
        raise ConfigError("--seeds", "must be at least 1")
    if not algorithms:
        raise ConfigError("--algorithms", "name at least one algorithm")
    targets = {name: retarget(config, name) for name in algorithms}  # validate all before running any
    base_name = config.output.name or f"{config.data.name}"
    out_dir = results.create_run_dir(config.output.dir, f"compare-{base_name}", config.to_yaml())
    runs: dict[str, list[Result]] = {}
    for name, (target, _) in targets.items():
        runs[name] = []
        for offset in range(seeds):
            seeded = target.model_copy(
                update={
                    "seed": config.seed + offset,
                    "output": target.output.model_copy(update={"dir": out_dir, "name": f"{name}-s{offset}"}),
                }
            )
            runner = start_run(seeded)
            if on_run is not None:
                on_run(name, offset, runner)
            runs[name].append(runner.run())
    rows = [_row(name, group) for name, group in runs.items()]
    dropped = {name: keys for name, (_, keys) in targets.items() if keys}
    results.write_json(out_dir / "comparison.json", {"rows": rows, "dropped_keys": dropped})
    curves = [(name, _mean_curve(group)) for name, group in runs.items()]
    plot_runs(curves, out_dir / results.PLOTS, axes={**AXES, **GIB_AXIS})
    return Comparison(out_dir, runs, rows, dropped)
