"""Side-by-side comparison: several algorithms on one config, over several seeds, as one table.

Each algorithm gets the base config with its ``algorithm`` block re-targeted: of the keys the user set,
those its own config class knows are kept and the rest dropped (and reported); every other key takes
that algorithm's own default, and ``name`` is set. ``algorithm.KEY=VALUE`` overrides given for the
comparison follow the same rule, so ``-a splitfed_v2,cse_fsl algorithm.h=2`` sets CSE-FSL's ``h`` and
leaves SplitFed v2 alone; a key none of the compared algorithms knows is refused as a typo. Seeds are
``seed, seed + 1, ...``. Every run is built (config, data, model) before any trains, and a run that
fails later leaves the table of those that finished. Results land in
``output.dir/compare-<name>/<algorithm>-s<seed>/`` next to ``comparison.json`` and plots of the
seed-averaged curves.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedge.config import AlgorithmConfig, RunConfig, apply_override, config_keys
from fedge.errors import ConfigError, Diverged, FedgeError
from fedge.experiments.labels import run_labels
from fedge.extend import load_config, parse_config
from fedge.files import results
from fedge.intake.locate import switch_algorithm
from fedge.intake.precheck import check_algorithm_overrides
from fedge.runner import stop
from fedge.runner.loop import BREAKDOWN, Result, Runner, build_run, start_run
from fedge.runner.plots import plot_runs
from fedge.runner.records import MIB, evaluated


@dataclass
class Comparison:
    """Every run of a comparison, the table rows and where they were written."""

    out_dir: Path
    runs: dict[str, list[Result]]
    rows: list[dict[str, Any]]
    dropped: dict[str, list[str]]


def _algorithm_keys(name: str) -> list[str]:
    """The keys algorithm ``name``'s block accepts; an unknown name is refused."""
    known = AlgorithmConfig.registry
    if name not in known:
        raise ConfigError("--algorithms", f"unknown algorithm {name!r}; known: {', '.join(sorted(known))}")
    return config_keys(known[name])


def retarget(config: RunConfig, name: str, overrides: list[str] | None = None) -> tuple[RunConfig, list[str]]:
    """``config`` with its algorithm block moved to algorithm ``name`` and the ``algorithm.*`` overrides
    applied; also the keys that did not fit ``name`` (dropped).

    The block's keys follow the rule every command reads configs by
    (:func:`fedge.intake.locate.switch_algorithm`); an override goes only to the algorithms that have its
    key."""
    fields = _algorithm_keys(name)
    raw = config.model_dump(mode="json")
    raw["algorithm"] = {
        **config.algorithm.model_dump(mode="json", exclude={"name"}, exclude_unset=True),
        "name": name,
    }
    dropped = switch_algorithm(raw, config.algorithm.name)
    for assignment in overrides or []:
        key = assignment.split("=", 1)[0].strip().removeprefix("algorithm.").split(".")[0]
        if key in fields:
            apply_override(raw, assignment)
        else:
            dropped.append(key)
    return parse_config(raw), sorted(set(dropped))


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _row(name: str, runs: list[Result], target: float | None = None) -> dict[str, Any]:
    """One table row: accuracy mean and std over seeds, communication, storage (and time to target)."""
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
        "communication_mb": statistics.fmean(bits) / MIB,
        "labels_mb": statistics.fmean(labels) / MIB,  # of communication_mb (split learning)
        "server_storage_mb": summaries[0]["storage_server_bits"] / MIB,
        "client_storage_mb": summaries[0]["storage_client_bits"] / MIB,
        "sim_seconds_mean": statistics.fmean(s["sim_seconds"] for s in summaries),
        "sim_joules_mean": statistics.fmean(s["sim_joules"] for s in summaries),
        "epsilon_mean": _epsilon_mean(summaries),
        **{f"{key}_mean": _mean_parts([s.get(key, {}) for s in summaries]) for key in BREAKDOWN},
        "wall_seconds_mean": statistics.fmean(s["wall_seconds"] for s in summaries),
        **(_to_target(runs, target) if target is not None else {}),
        **_perplexity(summaries),
        **_leaks(summaries),
    }


def _leaks(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The in-run attacks' last figures (``eval.attacks``), each the mean over the seeds that have it."""
    keys = list(dict.fromkeys(k for s in summaries for k in s.get("leaks", {})))
    if not keys:
        return {}
    found = {k: [s["leaks"][k] for s in summaries if k in s.get("leaks", {})] for k in keys}
    return {"leaks_mean": {k: statistics.fmean(v) for k, v in found.items()}}


def _epsilon_mean(summaries: list[dict[str, Any]]) -> float | None:
    """The privacy ledger's epsilon, mean over seeds (None: a run without a privacy mechanism)."""
    values = [s.get("epsilon") for s in summaries]
    known = [float(v) for v in values if v is not None]
    return statistics.fmean(known) if known and len(known) == len(values) else None


def _perplexity(summaries: list[dict[str, Any]]) -> dict[str, float]:
    """A language model's final perplexity, mean over seeds (nothing for a classifier)."""
    if not all("final_perplexity" in s for s in summaries):
        return {}
    return {"final_perplexity_mean": statistics.fmean(s["final_perplexity"] for s in summaries)}


def _mean_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each part of a breakdown over seeds (a part a run lacks counts as 0)."""
    keys = list(dict.fromkeys(k for part in parts for k in part))
    return {k: statistics.fmean(part.get(k, 0.0) for part in parts) for k in keys}


def _to_target(runs: list[Result], target: float) -> dict[str, Any]:
    """Mean rounds, MB and simulated seconds to the first evaluated round at ``target`` (of the seeds
    that got there)."""
    hits = [hit for hit in (stop.first_reached(r.metrics, target) for r in runs) if hit]
    mean = {
        key: statistics.fmean(h[key] for h in hits) if hits else None
        for key in ("round", "mb_total", "sim_seconds")
    }
    return {
        "target": target,
        "target_reached": len(hits),
        "rounds_to_target": mean["round"],
        "mb_to_target": mean["mb_total"],
        "sim_seconds_to_target": mean["sim_seconds"],
    }


def _mean_curve(runs: list[Result]) -> list[dict[str, float]]:
    """Seed-averaged accuracy (with its std over seeds) and costs per evaluated round common to all seeds."""
    scored = [evaluated(r.metrics) for r in runs]
    length = min(len(rows) for rows in scored)
    curve = []
    for i in range(length):
        point = {
            key: statistics.fmean(rows[i][key] for rows in scored)
            for key in ("round", "accuracy", "mb_total", "sim_seconds")
        }
        point["accuracy_std"] = (
            statistics.stdev(rows[i]["accuracy"] for rows in scored) if len(scored) > 1 else 0.0
        )
        curve.append(point)
    return curve


RunWatch = Callable[[str, int, Runner], AbstractContextManager[Any]]


class Unfinished(Exception):
    """A comparison that a run's error stopped: the table of the runs that finished (written to
    ``comparison.json`` with the failure), and the error itself."""

    def __init__(self, comparison: Comparison, error: BaseException):
        self.comparison, self.error = comparison, error
        super().__init__(comparison, error)


def compare(
    config: RunConfig,
    algorithms: list[str],
    seeds: int = 1,
    watch: RunWatch | None = None,
    target: float | None = None,
    seed_list: list[int] | None = None,
    algorithm_overrides: list[str] | None = None,
) -> Comparison:
    """Run every algorithm of ``algorithms`` on ``config`` for ``seeds`` seeds and tabulate them.

    Seeds are ``config.seed + 0 .. seeds - 1``, or exactly ``seed_list``; with ``target`` the rows also
    give the mean rounds, MB and simulated seconds to the first evaluated round at that accuracy.
    ``algorithm_overrides``: ``algorithm.KEY=VALUE`` strings, each applied to the algorithms that have
    ``KEY`` (module docstring). ``watch(name, seed offset, runner)`` gives the context each run runs in
    (the command line's progress).

    Every run is built once (config, data, model, algorithm) before any trains, so bad input fails in
    seconds, not after the runs before it. A run that fails later (a diverged loss, an interruption)
    raises :class:`Unfinished` with the table of the runs that finished, written like a whole one.
    """
    seed_values = seed_list if seed_list is not None else [config.seed + offset for offset in range(seeds)]
    if not seed_values:
        raise ConfigError("--seeds", "must be at least 1")
    if not algorithms:
        raise ConfigError("--algorithms", "name at least one algorithm")
    check_algorithm_overrides(algorithm_overrides or [], algorithms)
    targets = {name: retarget(config, name, algorithm_overrides) for name in algorithms}
    plans = [
        (name, offset, target_config.model_copy(update={"seed": seed}))
        for name, (target_config, _) in targets.items()
        for offset, seed in enumerate(seed_values)
    ]
    results.check_output_dir(config.output.dir)
    for name, _, planned in plans:  # every run's config, data and model, before any trains
        try:
            build_run(planned)
        except ConfigError as error:
            raise ConfigError(error.key, f"{error.message} ({name}, seed {planned.seed})") from None
    base_name = config.output.name or f"{config.data.name}"
    out_dir = results.create_run_dir(config.output.dir, f"compare-{base_name}", config.to_yaml())
    dropped = {name: keys for name, (_, keys) in targets.items() if keys}
    runs: dict[str, list[Result]] = {}
    for name, offset, planned in plans:
        output = planned.output.model_copy(update={"dir": out_dir, "name": f"{name}-s{offset}"})
        try:
            runner = start_run(planned.model_copy(update={"output": output}))
            with watch(name, offset, runner) if watch is not None else nullcontext():
                result = runner.run()
        except (FedgeError, Diverged, KeyboardInterrupt) as error:
            failed = {"algorithm": name, "seed": planned.seed, "error": str(error) or type(error).__name__}
            raise Unfinished(_tabulate(out_dir, runs, dropped, target, failed), error) from error
        runs.setdefault(name, []).append(result)
    return _tabulate(out_dir, runs, dropped, target)


def _tabulate(
    out_dir: Path,
    runs: dict[str, list[Result]],
    dropped: dict[str, list[str]],
    target: float | None,
    failed: dict[str, Any] | None = None,
) -> Comparison:
    """The comparison of the finished ``runs``, written to ``comparison.json`` (with the run that
    ``failed``, if one did) beside plots of the seed-averaged curves."""
    rows = [_row(name, group, target) for name, group in runs.items()]
    record = {"rows": rows, "dropped_keys": dropped, **({"failed": failed} if failed else {})}
    results.write_json(out_dir / "comparison.json", record)
    if runs:
        plot_runs([(name, _mean_curve(group)) for name, group in runs.items()], out_dir / results.PLOTS)
    return Comparison(out_dir, runs, rows, dropped)


def compare_runs(run_dirs: list[Path], target: float | None = None) -> Comparison:
    """A comparison of finished runs (no training): runs alike but for the seed make one row, named by
    what differs between the rows."""
    runs: dict[str, list[Result]] = {}
    for label, run_dir in zip(run_labels(run_dirs, ignore=("seed",)), run_dirs, strict=True):
        summary_path = Path(run_dir) / results.SUMMARY
        if not summary_path.is_file():
            raise FedgeError(f"{run_dir}: not a finished run (no {results.SUMMARY})")
        config = load_config(Path(run_dir) / results.CONFIG)
        summary = json.loads(summary_path.read_text())
        metrics = results.read_jsonl(Path(run_dir) / results.METRICS)
        runs.setdefault(label, []).append(Result(Path(run_dir), config, metrics, summary))
    rows = [_row(name, group, target) for name, group in runs.items()]
    return Comparison(Path(run_dirs[0]).parent, runs, rows, {})
