"""Small-scale versions of lightweight FedSL's figures (Figs. 2-4) on digits (or ``--dataset``).

Every run is ``light-fedsl-digits.yaml`` (mini-VGG-13-BN at width 1/4, 5 iid clients, b = 32, eta = 0.05,
T = 300 one-step rounds) with the overrides of its group, over several seeds:

- ``fig2b`` quantization (rho_f = 0, p = 0, I = 1, cut 4): q = 4, 8 and full precision against the FedSL
  baseline;
  ``fig2b_pair`` (and ``fig2a_pair``, ``fig3a_pair``) the claim's variants alone, without the baseline (the
  same runs);
- ``fig2a`` pruning (q full, p = 0, I = 1, cut 4): rho_f = 0 (the baseline), 0.35, 0.7;
- ``fig3a`` aggregation interval (rho_f = 0.35, q = 8, p = 0.3, cut 4): I = 1, 5, 10, and the same on a
  Dirichlet(0.3) label-skewed split (``fig3a_dirichlet``: iid shards hide the effect);
- ``fig3c`` number of clients (rho_f = 0.35, q = 8, p = 0.3, I = 5, cut 4): K = 5, 10, 20, the data split K
  ways, the same T;
- ``fig3bd`` dropout at three cuts (rho_f = 0.35, q = 8, I = 5): p = 0, 0.3, 0.7 at cuts 2, 4, 6 (standing
  in for VGG-19's 4, 8, 12), with the per-round cut latency (Fig. 4 as we read it); ``fig3bd_ends`` the
  claim's ends only (cuts 2 and 6, p = 0 and 0.7; the same runs).

The traditional-FedSL baseline (``fedsl``, cut 4) is drawn in every figure. Writes, under ``--out``:
``runs/`` (one sweep: a run directory per configuration and seed, ``results.csv`` and a table over
seeds; rerunning continues an interrupted sweep), ``results.json`` (each group's means, every
configuration's figures seed by seed under ``per_seed``, from which each paired interval can be
recomputed, and the pairs), ``table.md`` and
``plots/<group>_accuracy_vs_time.png``, ``plots/<group>_accuracy_vs_round.png`` and
``plots/fig4_latency_vs_dropout.png`` (measured mini-VGG latency next to the analytic VGG-19 curve).

``--compare-check`` instead runs ``fedge compare`` for every algorithm family on the same config (a few
rounds) and checks that simulated seconds and joules appear in each run's ``metrics.jsonl``, its summary
and ``comparison.json``.

Every group's table also pairs its first variant with each other one by seed (Fig. 3(b,d): per cut, what
dropout costs, and that cost at the shallowest cut minus at the deepest): the final accuracy's mean
difference with its 95 % t interval, "within noise" where the interval holds zero. Fig. 3(a)'s groups
also pair the rounds to 95 % (its claim is about speed) and Fig. 2(a)'s the fluctuation (its claim is
about stability).

Usage: ``python examples/light_fedsl_experiments.py [--seeds 0,1,2] [--rounds 300] [--dataset digits]
[--jobs 2] [--groups fig3c,fig2b] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import fedge  # noqa: E402
from fedge.config import SystemConfig, load_raw  # noqa: E402
from fedge.experiments.compare import compare  # noqa: E402
from fedge.experiments.sweep import SweepSpec, paired_text, run_sweep  # noqa: E402
from fedge.files import results  # noqa: E402
from fedge.models import build_model, output_shape, split  # noqa: E402
from fedge.runner.records import evaluated  # noqa: E402
from fedge.system import SystemModel, cut_latency  # noqa: E402

BASE = Path(__file__).with_name("light-fedsl-digits.yaml")
OFF = {"final_sparsity": 0.0, "quant_bits": None, "cut_dropout": 0.0, "agg_interval": 1}
PROPOSED = {"final_sparsity": 0.35, "quant_bits": 8, "cut_dropout": 0.3, "agg_interval": 5}
BASELINE = ("FedSL (baseline)", {"name": "fedsl"}, 4)
GROUPS: dict[str, list[tuple[str, dict[str, Any], int]]] = {
    "fig2b": [
        BASELINE,
        ("q=8", {**OFF, "quant_bits": 8}, 4),
        ("q=4", {**OFF, "quant_bits": 4}, 4),
        ("q=full", OFF, 4),  # the same client with quantization off: "q = 8 ~ full precision" pairs with it
    ],
    "fig2a": [
        BASELINE,
        ("rho_f=0.35", {**OFF, "final_sparsity": 0.35}, 4),
        ("rho_f=0.7", {**OFF, "final_sparsity": 0.7}, 4),
    ],
    "fig3a": [BASELINE] + [(f"I={i}", {**PROPOSED, "agg_interval": i}, 4) for i in (1, 5, 10)],
    "fig3bd": [BASELINE]
    + [(f"cut={c} p={p}", {**PROPOSED, "cut_dropout": p}, c) for c in (2, 4, 6) for p in (0.0, 0.3, 0.7)],
}
# Fig. 3(b,d)'s claim needs only its ends (the shallowest and deepest cut, no dropout and the most): a cheaper
# group whose runs are the same cells as fig3bd's.
GROUPS["fig3bd_ends"] = [
    (f"cut={c} p={p}", {**PROPOSED, "cut_dropout": p}, c) for c in (2, 6) for p in (0.0, 0.7)
]
# Fig. 2(a)'s, 2(b)'s and 3(a)'s claims (0.7 pruning noisier than 0.35; q = 4 clearly worse than q = 8; a
# longer aggregation interval costs accuracy) need only their variants: the groups without the baseline (the
# same runs).
GROUPS["fig2a_pair"] = GROUPS["fig2a"][1:]
GROUPS["fig2b_pair"] = GROUPS["fig2b"][1:]
GROUPS["fig3a_pair"] = GROUPS["fig3a"][1:]
# Fig. 3(c): the number of clients K (the paper gives no values; 5, 10 and 20 are ours), the data split K
# ways, the same T: the paper finds accuracy at fixed T lower with more clients.
GROUPS["fig3c"] = [(f"K={k}", PROPOSED, 4) for k in (5, 10, 20)]
CLIENTS = {"fig3c": {"K=5": 5, "K=10": 10, "K=20": 20}}
# Groups on other data than the base config's iid split (label skew, where iid shards hide the I effect).
GROUPS["fig3a_dirichlet"] = GROUPS["fig3a"]
PARTITIONS = {"fig3a_dirichlet": {"kind": "dirichlet", "alpha": 0.3, "min_size": 40}}
COMPARED = (
    "fedavg",
    "centralized",
    "splitfed_v1",
    "splitfed_v2",
    "fsl_an",
    "cse_fsl",
    "fedsl",
    "light_fedsl",
)


def slug(label: str, algorithm: dict[str, Any], cut: int) -> str:
    """A run-directory name for one configuration."""
    if algorithm.get("name") == "fedsl":
        return f"fedsl-cut{cut}"
    keys = ("final_sparsity", "quant_bits", "cut_dropout", "agg_interval")
    rho, q, p, interval = (algorithm[k] for k in keys)
    return f"light-cut{cut}-rho{rho}-q{q or 'full'}-p{p}-I{interval}"


def cell_name(group: str, label: str, algorithm: dict[str, Any], cut: int) -> str:
    """The sweep cell (and run-directory stem) of one configuration of ``group``."""
    partition = PARTITIONS.get(group)
    clients = CLIENTS.get(group, {}).get(label)
    return (
        slug(label, algorithm, cut)
        + (f"-dirichlet{partition['alpha']}" if partition else "")
        + (f"-K{clients}" if clients is not None and clients != 5 else "")
    )


def run_all(
    seeds: list[int], rounds: int, out: Path, dataset: str, jobs: int, groups: list[str]
) -> tuple[dict[str, list[list[dict]]], dict[str, list[int]]]:
    """Evaluated metric rows of every configuration (by cell name) and seed, and each cell's seeds in the
    same order: one sweep of the groups' configurations, whose cells are run once however many groups
    draw them (rerunning continues it)."""
    cells: dict[str, dict[str, Any]] = {}
    for group in groups:
        partition = PARTITIONS.get(group, {})
        for label, algorithm, cut in GROUPS[group]:
            overrides = {f"algorithm.{k}": v for k, v in algorithm.items()} | {"model.cut": cut}
            if label in CLIENTS.get(group, {}):
                overrides["partition.num_clients"] = CLIENTS[group][label]
            name = cell_name(group, label, algorithm, cut)
            cells[name] = overrides | {f"partition.{k}": v for k, v in partition.items()}
    raw = load_raw(BASE)
    raw.update(rounds=rounds, output={"dir": str(out), "plots": False}, eval={"every": max(1, rounds // 50)})
    raw["data"]["name"] = dataset
    spec = SweepSpec(cells=cells, seeds=seeds, jobs=jobs, name="runs")
    done = run_sweep(
        raw, spec, on_done=lambda t, n, total, eta: print(f"[{n}/{total}] {t.cell.label} seed {t.seed}")
    )
    runs: dict[str, list[list[dict]]] = {}
    seeds_of: dict[str, list[int]] = {}
    for task in done.tasks:
        runs.setdefault(task.cell.group, []).append(
            evaluated(results.read_jsonl(task.run_dir / results.METRICS))
        )
        seeds_of.setdefault(task.cell.group, []).append(task.seed)
    return runs, seeds_of


def first_round(rows: list[dict], level: float) -> float:
    """First evaluated round with accuracy >= ``level`` (NaN if never)."""
    return next((r["round"] for r in rows if r["accuracy"] >= level), float("nan"))


def fluctuation(rows: list[dict]) -> float:
    """Std of the round-to-round accuracy change over the second half of the run (Fig. 2(a)'s noisiness)."""
    acc = np.array([r["accuracy"] for r in rows[len(rows) // 2 :]])
    return float(np.diff(acc).std())


def summarize(runs: list[list[dict]]) -> dict[str, float]:
    """Seed statistics of one configuration."""

    def stat(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    last = [rows[-1] for rows in runs]
    final_mean, final_std = stat([r["accuracy"] for r in last])
    tail_mean, tail_std = stat([statistics.fmean(x["accuracy"] for x in rows[-5:]) for rows in runs])
    rounds = last[0]["round"]
    return {
        "final_accuracy": final_mean,
        "final_accuracy_std": final_std,
        "tail5_accuracy": tail_mean,
        "tail5_accuracy_std": tail_std,
        "best_accuracy": statistics.fmean(max(x["accuracy"] for x in rows) for rows in runs),
        "round_to_95": statistics.fmean(first_round(rows, 0.95) for rows in runs),
        "fluctuation": statistics.fmean(fluctuation(rows) for rows in runs),
        "sim_seconds": statistics.fmean(r["sim_seconds"] for r in last),
        "sim_joules": statistics.fmean(r["sim_joules"] for r in last),
        "cut_latency_ms": 1e3 * statistics.fmean(r["comm_seconds_total"] for r in last) / rounds,
        "agg_seconds": statistics.fmean(r["agg_seconds_total"] for r in last),
        "mb_total": statistics.fmean(r["mb_total"] for r in last),
        "client_sparsity": statistics.fmean(r["sparsity"] for r in last),
    }


def per_seed(seeds: list[int], runs: list[list[dict]]) -> list[dict[str, float]]:
    """One configuration's figures seed by seed (what its means and paired intervals are made of): final,
    last-5 and best accuracy, the first round at 95 % (None if never), fluctuation, simulated seconds
    and MB."""
    out = []
    for seed, rows in zip(seeds, runs, strict=True):
        reached = first_round(rows, 0.95)
        out.append(
            {
                "seed": seed,
                "final_accuracy": rows[-1]["accuracy"],
                "tail5_accuracy": statistics.fmean(x["accuracy"] for x in rows[-5:]),
                "best_accuracy": max(x["accuracy"] for x in rows),
                "round_to_95": None if np.isnan(reached) else reached,
                "fluctuation": fluctuation(rows),
                "sim_seconds": rows[-1]["sim_seconds"],
                "mb_total": rows[-1]["mb_total"],
            }
        )
    return out


def mean_curve(runs: list[list[dict]]) -> list[dict[str, float]]:
    """Seed-averaged accuracy, round and simulated time per evaluation."""
    keys = ("round", "accuracy", "sim_seconds")
    return [{k: statistics.fmean(rows[i][k] for rows in runs) for k in keys} for i in range(len(runs[0]))]


def plot_group(name: str, curves: list[tuple[str, list[dict]]], out: Path, dataset: str) -> None:
    for key, xlabel in (("sim_seconds", "simulated time (s)"), ("round", "round")):
        figure, axis = plt.subplots(figsize=(6.4, 4.2))
        for label, rows in curves:
            axis.plot([r[key] for r in rows], [100 * r["accuracy"] for r in rows], label=label, lw=1.2)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("test accuracy (%), mean of seeds")
        axis.set_ylim(top=100)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        axis.set_title(f"{name}: lightweight FedSL on {dataset} (mini-VGG)")
        suffix = "time" if key == "sim_seconds" else "round"
        figure.savefig(out / f"{name}_accuracy_vs_{suffix}.png", dpi=110, bbox_inches="tight")
        plt.close(figure)


def vgg19_smashed(cut: int) -> int:
    """Smashed values per sample of CIFAR VGG-19-BN cut after ``cut`` convs (meta device: no compute)."""
    with torch.device("meta"):
        trunk, _ = split(build_model("vgg", (3, 32, 32), 10), cut)
    return int(np.prod(output_shape(trunk, (3, 32, 32))))


def plot_latency(table: dict[str, dict], out: Path, dataset: str) -> dict[str, list[float]]:
    """Measured mini-VGG cut latency per round against p, and the analytic VGG-19 curves (Fig. 4)."""
    ps = (0.0, 0.3, 0.7)
    system = SystemModel(SystemConfig(distances="linspace"), 5, seed=0)
    analytic = {c: [cut_latency(system, 1, 64, vgg19_smashed(c), p) for p in ps] for c in (4, 8, 12)}
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for cut in (2, 4, 6):
        left.plot(
            ps, [table[f"cut={cut} p={p}"]["cut_latency_ms"] for p in ps], marker="o", label=f"cut {cut}"
        )
    for cut, values in analytic.items():
        right.plot(ps, values, marker="o", label=f"Lc = {cut}")
    left.set_title(f"mini-VGG on {dataset}, b = 32 (measured)")
    right.set_title("VGG-19-BN on CIFAR, b = 64, 300 m (analytic)")
    left.set_ylabel("cut latency per round (ms)")
    right.set_ylabel("cut latency per round (s)")
    for axis in (left, right):
        axis.set_xlabel("dropout p")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.savefig(out / "fig4_latency_vs_dropout.png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    return {f"Lc={c}": v for c, v in analytic.items()}


def markdown(groups: dict[str, dict[str, dict]]) -> str:
    header = (
        "| group | configuration | final acc. % | mean of last 5 evals % | best % | round to 95 % | "
        "fluctuation (pp) | sim. s | cut latency ms/round | T_agg total s | MB | client sparsity |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for group, table in groups.items():
        for label, s in table.items():
            lines.append(
                f"| {group} | {label} | "
                f"{100 * s['final_accuracy']:.2f} ± {100 * s['final_accuracy_std']:.2f} | "
                f"{100 * s['tail5_accuracy']:.2f} ± {100 * s['tail5_accuracy_std']:.2f} | "
                f"{100 * s['best_accuracy']:.2f} | {s['round_to_95']:.0f} | {100 * s['fluctuation']:.2f} | "
                f"{s['sim_seconds']:.2f} | {s['cut_latency_ms']:.3f} | {s['agg_seconds']:.3f} | "
                f"{s['mb_total']:.1f} | {s['client_sparsity']:.3f} |"
            )
    return header + "\n".join(lines) + "\n"


def paired_final(reference: list[list[dict]], other: list[list[dict]]) -> str:
    """Reference minus other final accuracy, seed by seed (same seed: same split and initialisation): the
    mean and its 95 % t interval in points, and whether the interval excludes zero."""
    return paired_text(final_differences(reference, other))


def final_differences(reference: list[list[dict]], other: list[list[dict]]) -> list[float]:
    """Reference minus other final accuracy in points, seed by seed."""
    return [100 * (a[-1]["accuracy"] - b[-1]["accuracy"]) for a, b in zip(reference, other, strict=True)]


def paired_rounds(runs: list[list[dict]], reference: list[list[dict]], level: float = 0.95) -> str:
    """Rounds to ``level`` of ``runs`` minus ``reference``, seed by seed, over the seeds where both reach
    it (how many do is named): the mean and its 95 % t interval."""
    pairs = [(first_round(a, level), first_round(b, level)) for a, b in zip(runs, reference, strict=True)]
    both = [a - b for a, b in pairs if not (np.isnan(a) or np.isnan(b))]
    if len(both) < 2:
        return f"{len(both)} of {len(pairs)} seeds reached {100 * level:.0f} % in both"
    return f"{paired_text(both)} ({len(both)} of {len(pairs)} seeds reached it in both)"


def group_pairs(group: str, runs: dict[str, list[list[dict]]]) -> dict[str, str]:
    """The paired tests a group's claim needs. Fig. 3(b,d) claims shallow cuts are robust to the cut
    dropout p and deep ones fragile: per cut, p = 0 minus each p > 0 (what dropout costs), and the cost at
    the shallowest cut minus the cost at the deepest (a difference of paired differences, which the claim
    says is below zero). Every other group: its first variant minus each of the others, and where the claim
    is about speed (Fig. 3(a)) or stability (Fig. 2(a)) each other's rounds to 95 % or fluctuation minus
    the first's."""
    if not group.startswith("fig3bd"):
        first, *others = [label for label in runs if label != BASELINE[0]]
        out = {f"{first} - {label}": paired_final(runs[first], runs[label]) for label in others}
        for label in others:
            if group.startswith("fig3a"):  # "larger I is slower": a claim about speed, not the end point
                out[f"rounds to 95 %: {label} - {first}"] = paired_rounds(runs[label], runs[first])
            if group.startswith("fig2a"):  # "larger rho_f is less stable": the curve's noisiness
                pairs = zip(runs[label], runs[first], strict=True)
                noisier = [100 * (fluctuation(a) - fluctuation(b)) for a, b in pairs]
                out[f"fluctuation (pp): {label} - {first}"] = paired_text(noisier)
        return out
    grid = [
        tuple(float(v.split("=")[1]) for v in label.split()) for label in runs if label.startswith("cut=")
    ]
    cuts = sorted({int(c) for c, _ in grid})
    drops = sorted({p for _, p in grid if p > 0})
    out, cost = {}, {}
    for cut in cuts:
        for p in drops:
            cost[cut, p] = final_differences(runs[f"cut={cut} p=0.0"], runs[f"cut={cut} p={p}"])
            out[f"cut={cut}: p=0.0 - p={p}"] = paired_text(cost[cut, p])
    for p in drops:
        shallow, deep = cost[cuts[0], p], cost[cuts[-1], p]
        out[f"p={p}: cost at cut {cuts[0]} - cost at cut {cuts[-1]}"] = paired_text(
            [a - b for a, b in zip(shallow, deep, strict=True)]
        )
    return out


def sweep(
    seeds: list[int], rounds: int, out: Path, dataset: str = "digits", jobs: int = 1, groups: list[str] = ()
) -> None:
    (out / "plots").mkdir(parents=True, exist_ok=True)
    chosen = list(groups) or list(GROUPS)
    cache, seeds_of = run_all(seeds, rounds, out, dataset, jobs, chosen)
    tables: dict[str, dict[str, dict]] = {}
    pairs: dict[str, dict[str, str]] = {}
    seed_rows: dict[str, dict[str, list[dict[str, float]]]] = {}
    for group in chosen:
        curves, table, names = [], {}, {}
        for label, algorithm, cut in GROUPS[group]:
            names[label] = cell_name(group, label, algorithm, cut)
            table[label] = summarize(cache[names[label]])
            curves.append((label, mean_curve(cache[names[label]])))
        tables[group] = table
        seed_rows[group] = {label: per_seed(seeds_of[name], cache[name]) for label, name in names.items()}
        pairs[group] = group_pairs(group, {label: cache[name] for label, name in names.items()})
        plot_group(group, curves, out / "plots", dataset)
    analytic = plot_latency(tables["fig3bd"], out / "plots", dataset) if "fig3bd" in tables else None
    summary = {
        "seeds": seeds,
        "rounds": rounds,
        "groups": tables,
        "per_seed": seed_rows,
        "paired": pairs,
        "fig4_vgg19_analytic_s": analytic,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    text = markdown(tables) + "\n" + paired_markdown(pairs)
    (out / "table.md").write_text(text)
    print(text)


def paired_markdown(pairs: dict[str, dict[str, str]]) -> str:
    lines = [
        "| group | paired by seed (final accuracy in points, unless named) | mean [95 % interval] |",
        "|---|---|---|",
    ]
    lines += [
        f"| {group} | {pair} | {text} |" for group, rows in pairs.items() for pair, text in rows.items()
    ]
    return "\n".join(lines) + "\n"


def compare_check(rounds: int, out: Path) -> None:
    """Every algorithm family under ``fedge compare``: simulated time and energy in all three places."""
    raw = load_raw(BASE)
    raw.update(rounds=rounds, output={"dir": str(out), "name": "check", "plots": False}, eval={"every": 1})
    outcome = compare(fedge.resolve_config(raw), list(COMPARED), seeds=1)
    saved = json.loads((outcome.out_dir / "comparison.json").read_text())
    report = {}
    for row in saved["rows"]:
        result = outcome.runs[row["algorithm"]][0]
        last = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        summary = json.loads((result.run_dir / "summary.json").read_text())
        figures = (last["sim_seconds"], summary["sim_seconds"], row["sim_seconds_mean"])
        energy = (last["sim_joules"], summary["sim_joules"], row["sim_joules_mean"])
        assert len(set(figures)) == 1 and figures[0] > 0 and len(set(energy)) == 1 and energy[0] > 0
        report[row["algorithm"]] = {"sim_seconds": figures[0], "sim_joules": energy[0]}
        print(
            f"{row['algorithm']:12s} sim {figures[0]:10.4f} s  {energy[0]:.4g} J"
            "  (metrics.jsonl = summary.json = comparison.json)"
        )
    (outcome.out_dir / "sim-check.json").write_text(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=lambda text: [int(s) for s in text.split(",")], default=[0, 1, 2])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("runs/light-fedsl-experiments"))
    parser.add_argument("--compare-check", action="store_true", help="only the simulated-time check")
    parser.add_argument(
        "--groups", type=lambda text: text.split(","), default=[], help=f"a subset of {', '.join(GROUPS)}"
    )
    args = parser.parse_args()
    if unknown := set(args.groups) - set(GROUPS):
        parser.error(f"--groups: unknown {', '.join(sorted(unknown))}; known: {', '.join(GROUPS)}")
    torch.set_num_threads(1)
    if args.compare_check:
        compare_check(3, args.out)
    else:
        sweep(args.seeds, args.rounds, args.out, args.dataset, args.jobs, args.groups)


if __name__ == "__main__":
    main()
