"""HIST's experiments on CPU: Table I (per-client MB to a target accuracy), Fig. 7(a) (AirComp vs SNR) and
latency to a target accuracy with optimised vs uniform mask sizes (Fig. 6 / Eq. 19, Eq. 36).

    python examples/hist_experiments.py table1  [--rounds 30] [--cells 2 4] [--targets 0.7 0.8]
    python examples/hist_experiments.py aircomp [--rounds 15] [--snr -20 -10 10] [--steps 20]
    python examples/hist_experiments.py latency [--rounds 20] [--target 0.75]
    python examples/hist_experiments.py table1 --seeds 1,2,3 --dataset mnist   # a set of runs per seed
    python examples/hist_experiments.py aircomp --seeds 1,2,3,4,5   # then paired over the seeds
    python examples/hist_experiments.py summary --seeds 1,2,3 --out OUT   # OUT/<split>/s<seed>, paired
    python examples/hist_experiments.py summary --seeds 1,2,3 --targets 0.7 --sweeps SWEEP ... --out OUT
        # the same from ``fedge sweep`` runs (examples/sweeps/hist-lenet-table1.yaml), keyed by their configs

Every run starts from ``examples/hist-fmnist.yaml`` or ``examples/hist-aircomp.yaml`` plus dotted
overrides (``--set key=value`` adds more, e.g. ``--set model.name=lenet5`` for the paper's Table I model),
stops once it has reached every target (``stop.target_accuracy``, or after ``--rounds``) and is an ordinary
run directory ``OUT/<run>/`` (``metrics.jsonl`` with one row per global round, ``fedge report OUT`` draws
them all); the summary table goes to ``OUT/<command>.md``. With ``--reuse`` a finished run is read, not
rerun. With several ``--seeds``, ``aircomp`` and ``latency`` also pair the seeds' runs (same seed: same
data, cells, initial model and radio draws) into ``OUT/<command>-paired.md``: what AirComp costs against
OMA, and what optimised mask sizes save against uniform ones, each with its 95 % interval. Full scale:
raise ``--rounds``.
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

import fedge
from fedge.algorithms.hierarchical.cells import Cells
from fedge.algorithms.hierarchical.config import RadioConfig
from fedge.algorithms.hierarchical.masks import partition_layout
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.experiments.sweep import finished_runs, paired_text, paired_verdict
from fedge.files import results
from fedge.models import build_model, count_parameters
from fedge.runner.loop import open_run, start_run
from fedge.runner.records import evaluated
from fedge.system import aircomp_cost_per_value, greedy_sizes, oma_cost_per_value, size_cap, uniform_sizes
from fedge.system.partition_opt import round_latency

EXAMPLES = Path(__file__).parent
# HIST Table I (LeNet-5, H = 40, E = 5): MB per client to the target, (HIST, HFedAvg), by (target, split, N)
PAPER_TABLE_I = {
    (0.7, "fully_noniid", 2): (13.20, 23.66),
    (0.7, "fully_noniid", 4): (8.08, 20.28),
    (0.7, "cell_iid", 2): (4.40, 6.76),
    (0.7, "cell_iid", 4): (3.32, 11.84),
    (0.8, "fully_noniid", 2): (115.30, 206.18),
    (0.8, "fully_noniid", 4): (76.06, 246.74),
    (0.8, "cell_iid", 2): (38.72, 86.20),
    (0.8, "cell_iid", 4): (24.72, 89.58),
}


def train(
    config: Path, overrides: list[str], rounds: int, stop_at: float | None, out: Path, reuse: bool = False
) -> list[dict[str, Any]]:
    """Run global rounds until the accuracy reaches ``stop_at`` (``stop.target_accuracy``) or ``rounds``
    are done, in the run directory ``out``; its rows (every round is evaluated in these configs).

    With ``reuse``, a finished run already in ``out`` is read and an interrupted one resumed instead:
    runs are deterministic, so rerunning would repeat them.
    """
    if reuse and (out / results.SUMMARY).is_file():
        print(f"{out.name}: reusing {out}")
        return evaluated(results.read_jsonl(out / results.METRICS))
    if reuse and (out / results.CONFIG).is_file():
        runner = open_run(out)
    else:
        shutil.rmtree(out, ignore_errors=True)
        stop = [f"stop.target_accuracy={stop_at}"] if stop_at is not None else []
        where = [f"output.dir={out.parent}", f"output.name={out.name}", "output.plots=false"]
        runner = start_run(fedge.resolve_config(config, [*overrides, f"rounds={rounds}", *stop, *where]))

    def show(t: int, row: dict[str, Any]) -> None:
        accuracy = f"{100 * row['accuracy']:6.2f}%" if "accuracy" in row else "   -   "
        print(
            f"{out.name:32s} round {t:3d}  acc {accuracy}  up/client {row['client_up_mb']:8.2f} MB  "
            f"sim {row['sim_seconds']:8.2f} s  wall {row['wall_seconds']:6.0f} s",
            flush=True,
        )

    runner.on_round = show
    return evaluated(runner.run().metrics)


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


def table1_run(name: str, cells: int) -> str:
    """The run directory's name of one ``table1`` run, which ``summary`` reads back."""
    return f"table1-{name}-n{cells}"


def table1(args: argparse.Namespace) -> str:
    config = EXAMPLES / "hist-fmnist.yaml"
    runs = {}
    for cells in args.cells:
        for name in ("hist", "hfedavg"):
            label = table1_run(name, cells)
            overrides = [f"algorithm.name={name}", f"algorithm.cells={cells}", *args.set]
            runs[(name, cells)] = train(
                config, overrides, args.rounds, max(args.targets), args.out / label, args.reuse
            )
    split = fedge.resolve_config(config, list(args.set)).algorithm.split
    lines = [
        "| target | N | HIST MB/client | HFedAvg MB/client | paper HIST | paper HFedAvg |",
        "|---|---|---|---|---|---|",
    ]
    for target in args.targets:
        for cells in args.cells:
            paper = [f"{v:.2f}" for v in PAPER_TABLE_I.get((target, split, cells), ())] or ["-", "-"]
            hist = reached(runs[("hist", cells)], target, "client_up_mb", "")
            avg = reached(runs[("hfedavg", cells)], target, "client_up_mb", "")
            lines.append(f"| {100 * target:.0f}% | {cells} | {hist} | {avg} | {paper[0]} | {paper[1]} |")
    lines += ["", "| run | MB/client per global round | wall s per global round |", "|---|---|---|"]
    for (name, cells), rows in runs.items():
        lines.append(
            f"| {name} N={cells} | {rows[0]['client_up_mb']:.4f} "
            f"| {rows[-1]['wall_seconds'] / len(rows):.1f} |"
        )
    return "\n".join(lines)


# a Table I run: (split, algorithm, N, seed)
RunKey = tuple[str, str, int, int]


def table1_runs(out: Path) -> dict[RunKey, Path]:
    """The ``table1`` command's runs under ``OUT/<split>/s<seed>/table1-<name>-n<cells>``."""
    runs = {}
    for run in out.glob("*/s*/table1-*-n*"):
        name, cells = run.name.removeprefix("table1-").rsplit("-n", 1)
        runs[(run.parent.parent.name, name, int(cells), int(run.parent.name.removeprefix("s")))] = run
    return runs


def sweep_runs(sweep: Path) -> dict[RunKey, Path]:
    """The finished runs of a ``fedge sweep`` directory (its ``index.csv``), keyed by each run's own
    config: the sweep's grid may name them in any order or leave split and N at the base config's. A run
    still going (or killed) is left out: its last round is not where it stops, which the equal-traffic
    comparison reads."""
    runs = {}
    for run in (finished.path for finished in finished_runs(sweep)):
        config = yaml.safe_load((run / results.CONFIG).read_text())
        algorithm = config["algorithm"]
        runs[(algorithm["split"], algorithm["name"], int(algorithm["cells"]), int(config["seed"]))] = run
    return runs


def mb_to_target(run: Path | None, target: float) -> float | None:
    """A run's MB per client at the first round reaching ``target``, or None (not reached, or no run)."""
    path = run / results.METRICS if run is not None else None
    row = first(evaluated(results.read_jsonl(path)), target) if path and path.is_file() else None
    return row["client_up_mb"] if row is not None else None


def best_within(rows: list[dict[str, Any]], budget: float) -> float:
    """The best accuracy among the evaluated rounds whose MB per client is within ``budget``."""
    return max((r["accuracy"] for r in rows if r["client_up_mb"] <= budget + 1e-9), default=float("nan"))


def equal_traffic(
    runs: dict[RunKey, Path], split: str, cells: int, seeds: list[int]
) -> tuple[list[float], list[float]]:
    """Per seed, the traffic at which the first of HIST and HFedAvg stopped (its target reached or its
    rounds spent) and the accuracy points HIST leads by within it: the comparison a row needs when a
    target is not reached by both (Table I reports traffic to a target; this is the same trade read at a
    fixed traffic instead)."""
    budgets, leads = [], []
    for seed in seeds:
        paths = [runs.get((split, name, cells, seed)) for name in ("hist", "hfedavg")]
        if not all(path is not None and (path / results.METRICS).is_file() for path in paths):
            continue
        hist, avg = (evaluated(results.read_jsonl(path / results.METRICS)) for path in paths)
        budget = min(hist[-1]["client_up_mb"], avg[-1]["client_up_mb"])
        lead = 100 * (best_within(hist, budget) - best_within(avg, budget))
        if not math.isnan(lead):  # nan: one run's first round already cost more than the budget
            budgets.append(budget)
            leads.append(lead)
    return budgets, leads


def summary(args: argparse.Namespace) -> str:
    """Table I over seeds and splits from finished ``table1`` runs in ``OUT/<split>/s<seed>/`` and the
    runs of ``--sweeps`` (where both hold a run, the sweep's counts): per row the
    MB per client to the target (mean over the seeds that reached it), HIST / HFedAvg paired by seed (the
    geometric mean ratio and the 95 % t interval of the mean log ratio), and the paper's orderings as
    paired differences with their 95 % t intervals (same seed: same data split, cells and initial
    model); last, per split and N, HIST's accuracy lead at equal traffic (:func:`equal_traffic`), which
    still compares the two where a target is out of reach."""
    runs = table1_runs(args.out)
    for sweep in args.sweeps:
        runs |= sweep_runs(sweep)
    splits = sorted({split for split, *_ in runs})
    mb = {
        (split, name, cells, target, seed): mb_to_target(runs.get((split, name, cells, seed)), target)
        for split in splits
        for name in ("hist", "hfedavg")
        for cells in args.cells
        for target in args.targets
        for seed in args.seeds
    }

    def per_seed(split: str, name: str, cells: int, target: float) -> list[float | None]:
        return [mb[split, name, cells, target, seed] for seed in args.seeds]

    def mean_text(split: str, name: str, cells: int, values: list[float | None]) -> str:
        """The mean of ``values`` (MB per seed to the target; None: not reached or not run) over the
        seeds that reached it, out of those whose run finished; the seeds without a finished run are
        named, as not reached is not the same as not run."""
        finished = [seed for seed in args.seeds if (split, name, cells, seed) in runs]
        if not finished:
            return "not finished"
        hits = [v for v in values if v is not None]
        text = f"{np.mean(hits):.2f} ({len(hits)}/{len(finished)})" if hits else f"none of {len(finished)}"
        missing = [str(seed) for seed in args.seeds if seed not in finished]
        if not missing:
            return text
        return f"{text}; seed{'s' if len(missing) > 1 else ''} {', '.join(missing)} not finished"

    def paired(a: list[float | None], b: list[float | None], ratio: bool = False) -> str:
        pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
        if len(pairs) < 2:
            return f"{len(pairs)} seed(s) reached both"
        if ratio:  # the interval of the mean log ratio, back on the ratio scale (a geometric mean)
            v = paired_verdict([math.log(x / y) for x, y in pairs])
            word = {"lower": "below 1", "higher": "above 1"}.get(v["verdict"], v["verdict"])
            shown = " / ".join(f"{x / y:.2f}" for x, y in pairs)
            low, mean, high = (math.exp(v[k]) for k in ("low", "mean", "high"))
            return f"{mean:.2f} [{low:.2f}, {high:.2f}] {word} ({shown})"
        return paired_text([x - y for x, y in pairs])

    lines = [
        "| target | split | N | HIST MB (seeds) | HFedAvg MB (seeds) | HIST / HFedAvg | HIST - HFedAvg MB |"
        " paper HIST, HFedAvg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target in args.targets:
        for split in splits:
            for cells in args.cells:
                hist, avg = per_seed(split, "hist", cells, target), per_seed(split, "hfedavg", cells, target)
                paper = PAPER_TABLE_I.get((target, split, cells))
                paper_text = f"{paper[0]:.2f}, {paper[1]:.2f}" if paper else "-"
                lines.append(
                    f"| {100 * target:.0f}% | {split} | {cells} | {mean_text(split, 'hist', cells, hist)} "
                    f"| {mean_text(split, 'hfedavg', cells, avg)} "
                    f"| {paired(hist, avg, ratio=True)} | {paired(hist, avg)} | {paper_text} |"
                )
    lines += ["", "| ordering (paper's) | paired difference, MB (95 % interval) |", "|---|---|"]
    low, high = min(args.cells), max(args.cells)
    for target in args.targets:
        for split in splits:
            for name in ("hist", "hfedavg"):
                lines.append(
                    f"| {100 * target:.0f}% {split}: {name} N={high} - N={low} "
                    f"| {paired(per_seed(split, name, high, target), per_seed(split, name, low, target))} |"
                )
        if {"fully_noniid", "cell_iid"} <= set(splits):
            for cells in args.cells:
                iid, noniid = (per_seed(s, "hist", cells, target) for s in ("cell_iid", "fully_noniid"))
                lines.append(
                    f"| {100 * target:.0f}% N={cells}: hist cell_iid - fully_noniid | {paired(iid, noniid)} |"
                )
    lines += [
        "",
        "| split | N | MB per client (the first of the two to stop; per seed) "
        "| HIST - HFedAvg, best accuracy within it (points; per seed) |",
        "|---|---|---|---|",
    ]
    for split in splits:
        for cells in args.cells:
            budgets, leads = equal_traffic(runs, split, cells, args.seeds)
            if leads:
                shown = " / ".join(f"{b:.1f}" for b in budgets)
                each = " / ".join(f"{lead:+.2f}" for lead in leads)
                lines.append(f"| {split} | {cells} | {shown} | {paired_text(leads)} ({each}) |")
    return "\n".join(lines)


OMA_RUN = "fig7a-oma"  # the run directory of the ``aircomp`` command's OMA baseline


def aircomp_run(snr: float, normalisation: str) -> str:
    """The run directory's name of one AirComp run of the ``aircomp`` command (``fig7a--20dB-paper``)."""
    return f"fig7a-{snr:+.0f}dB-{normalisation}"


def aircomp(args: argparse.Namespace) -> str:
    config = EXAMPLES / "hist-aircomp.yaml"
    base = [f"algorithm.local_steps={args.steps}", *args.set]
    runs = {
        "OMA-HIST": train(
            config,
            [*base, "algorithm.aggregation=oma"],
            args.rounds,
            None,
            args.out / OMA_RUN,
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
                args.out / aircomp_run(snr, norm),
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


def latency_run(scheme: str, sizes: str) -> str:
    """The run directory's name of one ``latency`` run (``latency-oma-hist-optimised``)."""
    return f"latency-{scheme.split()[0].lower()}-{sizes}"


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
            rows = train(
                config, overrides, args.rounds, args.target, args.out / latency_run(scheme, sizes), args.reuse
            )
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


def seed_rows(out: Path, seeds: list[int], name: str) -> list[list[dict[str, Any]]]:
    """The evaluated rows of run ``name`` for each seed, from ``OUT/s<seed>/<name>``."""
    return [evaluated(results.read_jsonl(out / f"s{seed}" / name / results.METRICS)) for seed in seeds]


def swing(rows: list[dict[str, Any]], tail: int = 5) -> float:
    """Max minus min accuracy over the last ``tail`` rounds, in points: Fig. 7(a)'s oscillation."""
    last = [100 * r["accuracy"] for r in rows[-tail:]]
    return max(last) - min(last)


def finals(runs: list[list[dict[str, Any]]]) -> str:
    """Each seed's final accuracy in percent, ``75.03 / 74.10``."""
    return " / ".join(f"{100 * rows[-1]['accuracy']:.2f}" for rows in runs)


def aircomp_paired(args: argparse.Namespace, out: Path, seeds: list[int]) -> str:
    """Fig. 7(a) over seeds, paired (same seed: same data, cells, initial model and radio draws): OMA-HIST's
    final accuracy minus each AirComp run's (what the channel noise costs), and the AirComp run's swing
    over the last 5 rounds minus OMA's (the oscillation the figure shows at low SNR)."""
    oma = seed_rows(out, seeds, OMA_RUN)
    lines = [
        "| run | final acc. % (per seed) | OMA - it, final acc. (points) | its swing - OMA's, last 5 rounds "
        "(points) |",
        "|---|---|---|---|",
        f"| OMA-HIST | {finals(oma)} | - | - |",
    ]
    for snr in args.snr:
        for norm in args.normalisation:
            runs = seed_rows(out, seeds, aircomp_run(snr, norm))
            cost = [100 * (a[-1]["accuracy"] - b[-1]["accuracy"]) for a, b in zip(oma, runs, strict=True)]
            wobble = [swing(b) - swing(a) for a, b in zip(oma, runs, strict=True)]
            lines.append(
                f"| AirComp-HIST {snr:+.0f} dB ({norm}) | {finals(runs)} | {paired_text(cost)} "
                f"| {paired_text(wobble)} |"
            )
    return "\n".join(lines)


def latency_paired(args: argparse.Namespace, out: Path, seeds: list[int]) -> str:
    """Latency to the target over seeds, paired: uniform mask sizes' simulated seconds minus the optimised
    sizes' (Eq. 19's saving), over the seeds where both runs reached the target, and per round."""
    optimised, uniform = (
        seed_rows(out, seeds, latency_run("OMA-HIST", kind)) for kind in ("optimised", "uniform")
    )
    to_target, per_round, shown = [], [], []
    for a, b in zip(uniform, optimised, strict=True):
        per_round.append(b[-1]["sim_seconds"] / len(b) / (a[-1]["sim_seconds"] / len(a)) - 1)
        hit_a, hit_b = first(a, args.target), first(b, args.target)
        if hit_a is not None and hit_b is not None:
            to_target.append(hit_a["sim_seconds"] - hit_b["sim_seconds"])
            shown.append(f"{hit_a['sim_seconds']:.2f} - {hit_b['sim_seconds']:.2f}")
    return "\n".join(
        [
            "| figure | per seed | paired over seeds |",
            "|---|---|---|",
            f"| uniform - optimised, simulated s to {100 * args.target:.0f} % ({len(to_target)} of "
            f"{len(seeds)} seeds reached it with both) | {' / '.join(shown) or '-'} "
            f"| {paired_text(to_target) if to_target else '-'} |",
            "| optimised / uniform - 1, simulated s per round (%) "
            f"| {' / '.join(f'{100 * v:+.1f}' for v in per_round)} "
            f"| {paired_text([100 * v for v in per_round])} |",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["table1", "aircomp", "latency", "summary"])
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
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(v) for v in text.split(",")],
        default=None,
        help="comma-separated seeds, each a full set of runs under OUT/s<seed> (default: the config's seed)",
    )
    parser.add_argument("--dataset", default=None, help="data.name (default: the config's fashion-mnist)")
    parser.add_argument("--out", type=Path, default=Path("runs/hist-experiments"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="read runs whose OUT/<run>.jsonl already answer")
    parser.add_argument(
        "--sweeps", type=Path, nargs="*", default=[], help="summary: fedge sweep directories to read too"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == "summary":
        args.seeds = args.seeds or [1]
        table = summary(args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(table + "\n")
        print(table)
        return
    command = {"table1": table1, "aircomp": aircomp, "latency": latency}[args.command]
    overrides, out = [*([f"data.name={args.dataset}"] if args.dataset else []), *args.set], args.out
    for seed in args.seeds or [None]:
        args.set = [*([f"seed={seed}"] if seed is not None else []), *overrides]
        args.out = out if seed is None else out / f"s{seed}"
        table = command(args)
        (args.out / f"{args.command}.md").write_text(table + "\n")
        print(table if seed is None else f"seed {seed}\n{table}")
    pairing = {"aircomp": aircomp_paired, "latency": latency_paired}.get(args.command)
    if pairing is not None and args.seeds and len(args.seeds) > 1:
        table = pairing(args, out, args.seeds)
        (out / f"{args.command}-paired.md").write_text(table + "\n")
        print(f"paired over seeds {', '.join(map(str, args.seeds))}\n{table}")


if __name__ == "__main__":
    main()
