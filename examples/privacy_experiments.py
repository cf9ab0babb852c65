"""Accuracy against epsilon on Fashion-MNIST: fedge's privacy mechanisms at small scale, 3 seeds paired.

Four experiments, each a grid of runs through the Python API (``fedge.run``) from an example config plus
dotted overrides, every figure read from the run's ``summary.json``:

- ``cut``: SplitFed v2 and CSE-FSL (h = 2) with noise on the smashed data (``privacy.cut``, clip 1, the
  multiplier calibrated to ``privacy.target_epsilon`` in 0.5 .. 8, and no mechanism), from
  ``examples/privacy-split.yaml``: accuracy, epsilon, MB and joules; each target paired with the
  non-private run of its seed, and CSE-FSL paired with SplitFed v2 at each target, both over 10 rounds
  and with SplitFed v2 stopped at CSE-FSL's MB (4 rounds, its noise calibrated to them).
- ``aircomp``: HIST with over-the-air aggregation whose receiver noise is accounted
  (``algorithm.radio.clip`` 20 and 50) at SNR -20, -10 and +10 dB, from ``examples/privacy-aircomp.yaml``;
  OMA without noise, and OMA with a clip and a ``gaussian`` stage at the edges whose multiplier gives the
  epsilon the AirComp run of the same seed and SNR reached (calibrated here by fedge's accountant over
  the run's edge rounds).
- ``dpfedavg``: client-level DP-FedAvg, 100 (and 1,000) clients joining each round with probability
  0.1 (Poisson), a clip and a ``gaussian`` stage at the server, target epsilon 0.5 .. 8 and no mechanism, from
  ``examples/privacy-fedavg.yaml``.
- ``dpsgd``: sample-level DP-SGD in the clients' local steps (``privacy.sample``) of SplitFed v2 and
  CSE-FSL together with the smashed data's noise (``privacy.cut``), one multiplier calibrated to the
  target epsilon 0.5 .. 8, from ``examples/privacy-split.yaml``.

A run whose config fedge refuses (a stage or mechanism this checkout does not have) is kept as a
``pending`` row naming the refusal; rerunning after it exists fills it in, and finished runs are read
back, not rerun (``--fresh`` reruns them). Writes ``docs/results/privacy_<experiment>.csv`` (one row per
run) and ``.json`` (the rows and the paired comparisons), and ``docs/results/privacy.md`` (every
experiment with results so far)::

    python examples/privacy_experiments.py                    # everything, seeds 1, 2, 3
    python examples/privacy_experiments.py --only aircomp     # one experiment
    python examples/privacy_experiments.py --quick --out /tmp/q   # a smoke version (1 seed, tiny runs)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fedge
from fedge.errors import ConfigError
from fedge.experiments.sweep import paired_text
from fedge.files import results
from fedge.privacy.accountant import calibrate
from fedge.privacy.release import GAUSSIAN, Release
from fedge.runner.records import evaluated

EXAMPLES = Path(__file__).parent
RESULTS = EXAMPLES.parent / "docs" / "results"
SEEDS = (1, 2, 3)
EPSILONS: tuple[float | None, ...] = (None, 0.5, 1.0, 2.0, 4.0, 8.0)
SNRS = (-20.0, -10.0, 10.0)
CLIPS = (20.0, 50.0)  # radio.clip: the bound on a client's transmitted accumulated gradient
SPLIT_ALGORITHMS = {"splitfed_v2": [], "cse_fsl": ["algorithm.h=2"]}
# SplitFed v2 stopped at CSE-FSL's traffic: CSE-FSL (h = 2) moves 68 MB in its 10 rounds, SplitFed v2
# 15.6 MB a round, so 4 rounds (62 MB) is the nearest equal-MB run; its noise is calibrated to 4 rounds
EQUAL_MB = {"splitfed_v2_4rounds": ["algorithm.name=splitfed_v2", "rounds=4"]}
# DP-FedAvg's populations: the config's 100 clients, and all 60,000 training images over 1,000 clients,
# where the ~100 clients of a round average the noise down ten times further (client-level DP needs many)
POPULATIONS = {"fedavg": [], "fedavg1k": ["partition.num_clients=1000", "data.train_limit=60000"]}
# --quick: one seed, one target, runs of a few hundred samples and one round (a smoke test, no figures)
QUICK = ["rounds=1", "data.train_limit=600", "data.test_limit=200"]
QUICK_HIST = ["algorithm.local_steps=2", "algorithm.edge_rounds=1"]


@dataclass
class Job:
    """One run: its experiment, the variant it belongs to (a table row), its config and overrides."""

    experiment: str
    variant: str
    seed: int
    config: Path
    overrides: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


def target_overrides(epsilon: float | None) -> list[str]:
    return [] if epsilon is None else [f"privacy.target_epsilon={epsilon}"]


def label(epsilon: float | None) -> str:
    return "none" if epsilon is None else f"eps{epsilon:g}"


def cut_jobs(seeds: list[int], epsilons: list[float | None], extra: list[str]) -> Iterator[Job]:
    """SplitFed v2 and CSE-FSL with smashed-data noise at every target (``none``: no ``privacy.cut``),
    then SplitFed v2 at CSE-FSL's MB (:data:`EQUAL_MB`)."""
    variants = {a: [f"algorithm.name={a}", *knobs] for a, knobs in SPLIT_ALGORITHMS.items()} | EQUAL_MB
    for variant, knobs in variants.items():
        for eps in epsilons:
            privacy = ["privacy.target_epsilon=null", "privacy.cut=null"] if eps is None else []
            for seed in seeds:
                yield Job(
                    "cut",
                    f"{variant}-{label(eps)}",
                    seed,
                    EXAMPLES / "privacy-split.yaml",
                    [*knobs, *privacy, *target_overrides(eps), *extra],
                    {"algorithm": knobs[0].removeprefix("algorithm.name="), "target": eps},
                )


def dpsgd_jobs(seeds: list[int], epsilons: list[float | None], extra: list[str]) -> Iterator[Job]:
    """SplitFed v2 and CSE-FSL with a whole sample-level guarantee: DP-SGD in the client steps
    (``privacy.sample``, clip 1) and noise on the smashed data (the config's ``privacy.cut``), one
    multiplier for both calibrated to the target (a split client releases both; without the cut's noise
    the smashed data's epsilon is infinite). The non-private rows are ``cut``'s."""
    for algorithm, knobs in SPLIT_ALGORITHMS.items():
        for eps in (e for e in epsilons if e is not None):
            for seed in seeds:
                yield Job(
                    "dpsgd",
                    f"{algorithm}-{label(eps)}",
                    seed,
                    EXAMPLES / "privacy-split.yaml",
                    [
                        f"algorithm.name={algorithm}",
                        *knobs,
                        "privacy.sample={clip: 1.0}",
                        *target_overrides(eps),
                        *extra,
                    ],
                    {"algorithm": algorithm, "target": eps},
                )


def dpfedavg_jobs(seeds: list[int], epsilons: list[float | None], extra: list[str]) -> Iterator[Job]:
    """FedAvg with Poisson participation in each population of :data:`POPULATIONS`, with (a target) or
    without (``none``) the server's clip and gaussian stages."""
    stages = (
        "aggregation.stages=[{name: clip, at: [server], options: {clip: 1.0}},"
        " {name: gaussian, at: [server]}]"
    )
    for population, knobs in POPULATIONS.items():
        for eps in epsilons:
            dp = [] if eps is None else [stages, *target_overrides(eps)]
            for seed in seeds:
                yield Job(
                    "dpfedavg",
                    f"{population}-{label(eps)}",
                    seed,
                    EXAMPLES / "privacy-fedavg.yaml",
                    [*knobs, *dp, *extra],
                    {"algorithm": "fedavg", "target": eps},
                )


def aircomp_jobs(seeds: list[int], snrs: list[float], clips: list[float], extra: list[str]) -> Iterator[Job]:
    """AirComp-HIST at every clip and SNR, and OMA-HIST without noise (the OMA rows with noise at equal
    epsilon follow each AirComp run: :func:`oma_noise_job`)."""
    for seed in seeds:
        yield Job(
            "aircomp",
            "oma",
            seed,
            EXAMPLES / "privacy-aircomp.yaml",
            ["algorithm.aggregation=oma", "algorithm.radio.clip=null", *extra],
            {"algorithm": "hist", "aggregation": "oma"},
        )
        for clip in clips:
            for snr in snrs:
                yield Job(
                    "aircomp",
                    air_variant(clip, snr),
                    seed,
                    EXAMPLES / "privacy-aircomp.yaml",
                    [f"algorithm.radio.snr_db=[{snr}]", f"algorithm.radio.clip={clip}", *extra],
                    {"algorithm": "hist", "aggregation": "aircomp", "snr_db": snr, "clip": clip},
                )


def air_variant(clip: float, snr: float) -> str:
    """AirComp-HIST's variant at ``clip`` and ``snr`` dB (``aircomp-c20-snr-10``)."""
    return f"aircomp-c{clip:g}-snr{snr:+g}"


def oma_variant(clip: float, snr: float) -> str:
    """OMA-HIST with edge noise at the epsilon of AirComp at ``clip`` and ``snr`` dB."""
    return f"oma-noise-c{clip:g}-snr{snr:+g}"


def equal_epsilon_multiplier(epsilon: float, releases: int, delta: float) -> float:
    """The noise multiplier whose ``releases`` Gaussian releases (one a cell and edge round, no sampling)
    spend ``epsilon`` at ``delta``: OMA's explicit edge noise matching an AirComp run's epsilon."""

    def history(z: float) -> dict[tuple[Any, ...], int]:
        return {Release(1, "edge", "client", GAUSSIAN, z).shape(): releases}

    return calibrate(history, epsilon, delta)


def oma_noise_job(air: Job, row: dict[str, Any]) -> Job | None:
    """OMA-HIST with a clip and a gaussian stage at the edges, at the epsilon the AirComp run ``row``
    reached (None where it reached none). The edge stages clip each client's update, the accumulated
    gradient times the learning rate, so the clip is AirComp's ``radio.clip`` times lr: the same bound."""
    if row.get("status") != "done" or not row.get("epsilon"):
        return None
    config = fedge.resolve_config(air.config, air.overrides)
    edge_rounds = config.rounds * config.algorithm.edge_rounds
    z = equal_epsilon_multiplier(row["epsilon"], edge_rounds, config.privacy.delta)
    clip = config.algorithm.radio.clip * config.algorithm.optimizer.lr
    stages = (
        f"aggregation.stages=[{{name: clip, at: [edge], options: {{clip: {clip:.6g}}}}},"
        f" {{name: gaussian, at: [edge], options: {{noise_multiplier: {z:.6g}}}}}]"
    )
    overrides = [
        o for o in air.overrides if not o.startswith(("algorithm.radio.snr_db", "algorithm.radio.clip"))
    ]
    snr, bound = air.meta["snr_db"], air.meta["clip"]
    return Job(
        "aircomp",
        oma_variant(bound, snr),
        air.seed,
        air.config,
        ["algorithm.aggregation=oma", "algorithm.radio.clip=null", stages, *overrides],
        {"algorithm": "hist", "aggregation": "oma+noise", "snr_db": snr, "clip": bound, "multiplier": z},
    )


def read_row(job: Job, run: Path) -> dict[str, Any]:
    """A finished run's row: its summary's headline figures and the noise multiplier its releases used
    (the mean over them, AirComp's varying with the channel)."""
    summary = json.loads((run / results.SUMMARY).read_text())
    rows = evaluated(results.read_jsonl(run / results.METRICS))
    multipliers = []
    ledger = run / "privacy.csv"
    if ledger.is_file():
        with ledger.open() as handle:
            multipliers = [float(r["noise_multiplier"]) for r in csv.DictReader(handle)]
    return {
        **base_row(job),
        "status": "done",
        "final_accuracy": summary["final_accuracy"],
        "best_accuracy": max(r["accuracy"] for r in rows),
        "epsilon": summary["epsilon"],
        "delta": summary["delta"],
        "noise_multiplier": statistics.fmean(multipliers) if multipliers else None,
        "mb_up": summary["mb_up"],
        "mb_total": summary["mb_total"],
        "sim_joules": summary["sim_joules"],
        "rounds": summary["rounds"],
        "wall_seconds": summary["wall_seconds"],
        "note": "",
    }


def base_row(job: Job) -> dict[str, Any]:
    return {"experiment": job.experiment, "variant": job.variant, "seed": job.seed, **job.meta}


def execute(job: Job, out: Path, fresh: bool) -> dict[str, Any]:
    """Run ``job`` under ``out/<experiment>/<name>`` (or read it back when finished), or a ``pending``
    row carrying the one-line refusal of a config this checkout cannot run yet."""
    run = out / job.experiment / job.name
    if not fresh and (run / results.SUMMARY).is_file():
        return read_row(job, run)
    where = [f"seed={job.seed}", f"output.dir={run.parent}", f"output.name={run.name}", "output.plots=false"]
    try:
        fedge.run(job.config, [*job.overrides, *where], force=True)
    except ConfigError as error:
        print(f"{job.experiment}/{job.name}: pending ({error})", flush=True)
        return {**base_row(job), "status": "pending", "note": str(error)}
    row = read_row(job, run)
    eps = "-" if row["epsilon"] is None else f"{row['epsilon']:.3g}"
    print(f"{job.experiment}/{job.name}: acc {100 * row['final_accuracy']:.2f} %  eps {eps}", flush=True)
    return row


# ---- tables -------------------------------------------------------------------------------------------


def done(rows: list[dict[str, Any]], variant: str) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in rows if r["variant"] == variant and r["status"] == "done"}


def mean_of(by_seed: dict[int, dict[str, Any]], key: str, fmt: str, scale: float = 1.0) -> str:
    values = [r[key] * scale for r in by_seed.values() if r.get(key) is not None]
    if not values:
        return "-"
    if len(set(values)) == 1:  # one seed, or equal on every seed (a calibrated target, the MB)
        return format(values[0], fmt)
    return f"{format(statistics.fmean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def pair(
    rows: list[dict[str, Any]], first: str, second: str, key: str = "final_accuracy"
) -> dict[str, Any] | None:
    """``first`` minus ``second`` in points, seed by seed, where both finished (None: no pair)."""
    a, b = done(rows, first), done(rows, second)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    diffs = [100 * (a[s][key] - b[s][key]) for s in seeds]
    return {
        "first": first,
        "second": second,
        "seeds": seeds,
        "differences": diffs,
        "text": paired_text(diffs),
    }


def variant_line(rows: list[dict[str, Any]], variant: str, columns: list[tuple[str, str, float]]) -> str:
    """One table line: the variant, its per-seed final accuracy and the means of ``columns``."""
    runs = done(rows, variant)
    pending = [r for r in rows if r["variant"] == variant and r["status"] == "pending"]
    if not runs:
        why = pending[0]["note"] if pending else "not run"
        return f"| {variant} | pending: {why} |" + " |" * len(columns)
    seeds = " / ".join(f"{100 * r['final_accuracy']:.2f}" for _, r in sorted(runs.items()))
    cells = [mean_of(runs, key, fmt, scale) for key, fmt, scale in columns]
    return f"| {variant} | {seeds} | " + " | ".join(cells) + " |"


COLUMNS = [
    ("final_accuracy", ".2f", 100.0),
    ("best_accuracy", ".2f", 100.0),
    ("epsilon", ".3g", 1.0),
    ("noise_multiplier", ".3g", 1.0),
    ("mb_total", ".1f", 1.0),
    ("sim_joules", ".1f", 1.0),
]
HEADER = (
    "| run | final acc. % per seed | final acc. % | best acc. % | epsilon | noise multiplier | MB (up+down)"
    " | joules |\n|---|---|---|---|---|---|---|---|"
)


def targets_table(
    rows: list[dict[str, Any]], algorithms: list[str], baseline: str | None
) -> tuple[str, list]:
    """Per algorithm and target: the figures, and the paired accuracy cost of each target against the
    same algorithm's non-private run (``baseline``: the variant suffix of that run)."""
    lines, pairs = [HEADER], []
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    for algorithm in algorithms:
        for variant in (v for v in variants if v.startswith(f"{algorithm}-")):
            lines.append(variant_line(rows, variant, COLUMNS))
    if baseline is not None:
        lines += ["", "| run | its final acc. - non-private (points), paired | seeds |", "|---|---|---|"]
        for algorithm in algorithms:
            for variant in (v for v in variants if v.startswith(f"{algorithm}-") and not v.endswith("none")):
                p = pair(rows, variant, f"{algorithm}-{baseline}")
                if p is not None:
                    pairs.append(p)
                    lines.append(f"| {variant} | {p['text']} | {len(p['seeds'])} |")
    return "\n".join(lines), pairs


def cse_versus_splitfed(rows: list[dict[str, Any]], other: str) -> tuple[str, list]:
    """CSE-FSL minus SplitFed v2 run ``other`` at each target, paired by seed, with the MB of each."""
    lines = [
        f"| target | CSE-FSL - {other}, final acc. (points), paired | MB CSE-FSL / {other} |",
        "|---|---|---|",
    ]
    pairs = []
    for eps in EPSILONS:
        p = pair(rows, f"cse_fsl-{label(eps)}", f"{other}-{label(eps)}")
        if p is None:
            continue
        pairs.append(p)
        mb = [mean_of(done(rows, f"{a}-{label(eps)}"), "mb_total", ".1f") for a in ("cse_fsl", other)]
        lines.append(f"| {label(eps)} | {p['text']} | {mb[0]} / {mb[1]} |")
    return "\n".join(lines), pairs


def aircomp_table(rows: list[dict[str, Any]]) -> tuple[str, list]:
    lines = [HEADER, variant_line(rows, "oma", COLUMNS)]
    pairs = []
    settings = list(
        dict.fromkeys((r["clip"], r["snr_db"]) for r in rows if r.get("aggregation") == "aircomp")
    )
    for clip, snr in settings:
        lines.append(variant_line(rows, air_variant(clip, snr), COLUMNS))
        lines.append(variant_line(rows, oma_variant(clip, snr), COLUMNS))
    lines += [
        "",
        "| clip | SNR | OMA - AirComp, final acc. (points) | AirComp - OMA + noise at its epsilon (points) |",
        "|---|---|---|---|",
    ]
    for clip, snr in settings:
        air = air_variant(clip, snr)
        first, second = pair(rows, "oma", air), pair(rows, air, oma_variant(clip, snr))
        pairs += [p for p in (first, second) if p is not None]
        texts = [p["text"] if p is not None else "-" for p in (first, second)]
        lines.append(f"| {clip:g} | {snr:+g} dB | {texts[0]} | {texts[1]} |")
    return "\n".join(lines), pairs


TITLES = {
    "cut": "Smashed-data noise: SplitFed v2 and CSE-FSL (h = 2)",
    "aircomp": "HIST: AirComp's receiver noise against OMA",
    "dpfedavg": "Client-level DP-FedAvg (Poisson participation)",
    "dpsgd": "Sample-level DP-SGD: SplitFed v2 and CSE-FSL (h = 2)",
}


def tables(experiment: str, rows: list[dict[str, Any]]) -> tuple[str, list]:
    """The markdown of one experiment and its paired comparisons."""
    if experiment == "cut":
        text, pairs = targets_table(rows, [*SPLIT_ALGORITHMS, *EQUAL_MB], "none")
        for other in ("splitfed_v2", *EQUAL_MB):
            more, more_pairs = cse_versus_splitfed(rows, other)
            text, pairs = f"{text}\n\n{more}", pairs + more_pairs
        return text, pairs
    if experiment == "aircomp":
        return aircomp_table(rows)
    if experiment == "dpfedavg":
        return targets_table(rows, list(POPULATIONS), "none")
    return targets_table(rows, list(SPLIT_ALGORITHMS), None)


def write(experiment: str, rows: list[dict[str, Any]], where: Path, command: str) -> None:
    """``privacy_<experiment>.csv`` / ``.json`` under ``where``, then ``privacy.md`` from every
    experiment's json there."""
    where.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with (where / f"privacy_{experiment}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, keys)
        writer.writeheader()
        writer.writerows(rows)
    text, pairs = tables(experiment, rows)
    record = {"experiment": experiment, "command": command, "rows": rows, "paired": pairs, "markdown": text}
    (where / f"privacy_{experiment}.json").write_text(json.dumps(record, indent=1) + "\n")
    parts = ["# Privacy experiments on Fashion-MNIST (small scale, seeds paired)", ""]
    for name, title in TITLES.items():
        path = where / f"privacy_{name}.json"
        if path.is_file():
            kept = json.loads(path.read_text())
            parts += [f"## {title}", "", f"`{kept['command']}`", "", kept["markdown"], ""]
    (where / "privacy.md").write_text("\n".join(parts))


EXPERIMENTS: dict[str, Callable[[argparse.Namespace], Iterator[Job]]] = {
    "cut": lambda a: cut_jobs(a.seeds, a.epsilons, a.extra),
    "aircomp": lambda a: aircomp_jobs(a.seeds, a.snrs, a.clips, a.extra + a.extra_hist),
    "dpfedavg": lambda a: dpfedavg_jobs(a.seeds, a.epsilons, a.extra),
    "dpsgd": lambda a: dpsgd_jobs(a.seeds, a.epsilons, a.extra),
}


def run_experiment(name: str, args: argparse.Namespace, command: str) -> list[dict[str, Any]]:
    rows = []
    for job in EXPERIMENTS[name](args):
        row = execute(job, args.out, args.fresh)
        rows.append(row)
        if job.meta.get("aggregation") == "aircomp":
            follow = oma_noise_job(job, row)
            if follow is not None:
                rows.append(execute(follow, args.out, args.fresh))
        write(name, rows, args.results, command)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(EXPERIMENTS), action="append", help="run only this one")
    parser.add_argument("--quick", action="store_true", help="a smoke version: 1 seed, tiny runs")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds")
    parser.add_argument("--out", type=Path, default=Path("runs/privacy"), help="run directories")
    parser.add_argument("--results", type=Path, help="tables (default docs/results; --quick: --out)")
    parser.add_argument("--fresh", action="store_true", help="rerun finished runs instead of reading them")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    command = " ".join(["python examples/privacy_experiments.py", *argv])
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.epsilons, args.snrs, args.clips = list(EPSILONS), list(SNRS), list(CLIPS)
    args.extra, args.extra_hist = [], []
    if args.quick:
        args.seeds, args.epsilons, args.snrs, args.clips = args.seeds[:1], [None, 2.0], [-10.0], [20.0]
        args.extra, args.extra_hist = list(QUICK), list(QUICK_HIST)
    if args.results is None:
        args.results = args.out if args.quick else RESULTS
    for name in args.only or list(EXPERIMENTS):
        run_experiment(name, args, command)


if __name__ == "__main__":
    main()
