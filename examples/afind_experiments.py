"""AFIND+ reproduction at small scale: identification (Sec. 3.2), Tables 1-4 analogues, speed.

Usage (each section prints a markdown table and writes ``<out>/<section>.json``)::

    python examples/afind_experiments.py identify table1 topology ablation speed
    python examples/afind_experiments.py table1 --clients 100 --train-limit 60000 --rounds 100
    python examples/afind_experiments.py table1 --seeds 7,8,9 --dataset mnist --jobs 2

Every configuration of a table runs as a sweep over the seeds under ``<out>/runs/`` (rerunning continues
an interrupted one).

Sections: ``identify`` (precision / AUC of AFIND+'s neighbours on the grouped partition against
random selection), ``table1`` (Local, FedAvg-FT, Gossip, PENS, FedeRiCo, AFIND+ on pathological c=2 and
Dirichlet 0.1 / 0.5), ``topology`` (Table 3: partial Erdős–Rényi(0.5) graph), ``ablation`` (Table 2:
random -> +i top-k -> +ii threshold -> +iii Boltzmann), ``dp`` (Table 4: noise on the proxies),
``hosts`` (Fig. 5: Ditto and Dis-PFL with random peers vs AFIND+) and ``speed`` (rounds per second
with ``--speed-clients`` clients on the batched executor, and the share of AFIND+'s scoring).
Accuracies are the mean client test accuracy after a 1-epoch fine-tune, best over evaluated rounds
and at the last round, mean ± sample std over seeds.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedge
from fedge.config import AlgorithmConfig, parse_config
from fedge.experiments.sweep import SweepSpec, run_sweep
from fedge.files import results
from fedge.runner.loop import build_run
from fedge.runner.records import evaluated

BASE = Path(__file__).with_name("afind-fashion-mnist.yaml")
PARTITIONS = {
    "path c=2": {"kind": "pathological", "classes_per_client": 2},
    "dir 0.1": {"kind": "dirichlet", "alpha": 0.1},
    "dir 0.5": {"kind": "dirichlet", "alpha": 0.5},
}
TABLE1 = ["local", "fedavg_ft", "gossip", "pens", "federico", "afind"]
ABLATION = {
    "FedAvg-FT (random)": {"selection": "random", "aggregation": "uniform"},
    "+ i (top-k)": {"selection": "topk", "aggregation": "uniform"},
    "+ i + ii (threshold, AFIND)": {"selection": "threshold", "aggregation": "uniform"},
    "+ i + ii + iii (AFIND+)": {"selection": "threshold", "aggregation": "boltzmann"},
}


def base_config(args: argparse.Namespace) -> dict[str, Any]:
    """The example config with the command line's scale applied."""
    raw = fedge.load_config(BASE).model_dump(mode="json")
    raw["rounds"] = args.rounds
    raw["data"].update(name=args.dataset, train_limit=args.train_limit, test_limit=args.test_limit)
    raw["partition"]["num_clients"] = args.clients
    raw["algorithm"]["local_epochs"] = args.local_epochs
    raw["output"] = {"dir": str(args.out / "runs"), "plots": False, "checkpoint_every": args.rounds}
    return raw


def with_algorithm(raw: dict[str, Any], name: str, **overrides: Any) -> dict[str, Any]:
    """``raw`` re-targeted to algorithm ``name``; keys it does not know are dropped (as ``fedge compare``)."""
    raw = copy.deepcopy(raw)
    known = AlgorithmConfig.registry[name].model_fields
    block = {k: v for k, v in raw["algorithm"].items() if k in known and k != "name"}
    raw["algorithm"] = {**block, **overrides, "name": name}
    return raw


def run_seeds(raw: dict[str, Any], args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Run ``raw`` over ``--seeds`` as the sweep ``name`` (resumable, ``--jobs`` processes); best / last
    accuracy and selection statistics per seed, over evaluated rounds."""
    spec = SweepSpec(seeds=args.seeds, jobs=args.jobs, name=re.sub(r"[^A-Za-z0-9_.+-]+", "_", name))
    outcome = run_sweep(raw, spec)
    best, last, selected, fallbacks, seconds = [], [], [], [], []
    for task in outcome.tasks:
        rows = evaluated(results.read_jsonl(task.run_dir / results.METRICS))
        best.append(max(r["accuracy"] for r in rows))
        last.append(rows[-1]["accuracy"])
        selected.append(statistics.fmean(r.get("selected_mean", float("nan")) for r in rows))
        fallbacks.append(sum(r.get("fallbacks", 0) for r in rows))
        seconds.append(rows[-1]["wall_seconds"])
    return {"best": best, "last": last, "selected": selected, "fallbacks": fallbacks, "seconds": seconds}


def pm(values: list[float]) -> str:
    """Percent mean ± sample std."""
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def table(title: str, columns: list[str], rows: dict[str, dict[str, dict[str, Any]]], key: str) -> str:
    lines = [f"**{title}** ({key})", "", "| method | " + " | ".join(columns) + " |"]
    lines.append("|---" * (len(columns) + 1) + "|")
    for name, cells in rows.items():
        lines.append(
            f"| {name} | " + " | ".join(pm(cells[c][key]) if c in cells else "-" for c in columns) + " |"
        )
    return "\n".join(lines)


def section_table1(args, raw, partitions=None, topology=None, algorithms=None) -> dict:
    partitions = partitions or list(PARTITIONS)
    rows: dict[str, dict[str, Any]] = {}
    for part in partitions:
        for name in algorithms or TABLE1:
            cfg = with_algorithm(raw, name)
            cfg["partition"] = {**cfg["partition"], **PARTITIONS[part]}
            if topology and name != "fedavg_ft":
                cfg["algorithm"]["topology"] = topology
            rows.setdefault(name, {})[part] = run_seeds(
                cfg, args, f"{name}-{part}-{'partial' if topology else 'full'}"
            )
            print(f"  {name:10s} {part:9s} best {pm(rows[name][part]['best'])}", flush=True)
    return rows


def section_ablation(args, raw) -> dict:
    rows: dict[str, dict[str, Any]] = {}
    for part in ("path c=2", "dir 0.1"):
        for label, switches in ABLATION.items():
            cfg = with_algorithm(raw, "afind", **switches)
            cfg["partition"] = {**cfg["partition"], **PARTITIONS[part]}
            rows.setdefault(label, {})[part] = run_seeds(cfg, args, f"{label}-{part}")
            print(f"  {label:28s} {part:9s} best {pm(rows[label][part]['best'])}", flush=True)
    return rows


def section_dp(args, raw) -> dict:
    rows: dict[str, dict[str, Any]] = {}
    for part in ("path c=2", "dir 0.1"):
        for sigma in (0, 2, 10, 50):
            cfg = with_algorithm(raw, "afind", dp=None if sigma == 0 else {"sigma": sigma, "clip": 1.0})
            cfg["partition"] = {**cfg["partition"], **PARTITIONS[part]}
            rows.setdefault(f"sigma_2 = {sigma}", {})[part] = run_seeds(cfg, args, f"dp{sigma}-{part}")
            print(
                f"  sigma {sigma:3d} {part:9s} best {pm(rows[f'sigma_2 = {sigma}'][part]['best'])}",
                flush=True,
            )
    return rows


def section_hosts(args, raw) -> dict:
    rows: dict[str, dict[str, Any]] = {}
    for part in ("path c=2", "dir 0.1"):
        for host in ("ditto", "dispfl"):
            for choice in ("random", "afind"):
                afind = {
                    k: v
                    for k, v in raw["algorithm"].items()
                    if k in ("k0", "tau", "upsilon", "gamma", "t_agg")
                }
                cfg = with_algorithm(raw, host, peer_selection=choice, afind=afind)
                cfg["partition"] = {**cfg["partition"], **PARTITIONS[part]}
                label = f"{host} + {choice}"
                rows.setdefault(label, {})[part] = run_seeds(cfg, args, f"{label}-{part}")
                print(f"  {label:18s} {part:9s} best {pm(rows[label][part]['best'])}", flush=True)
    return rows


def section_identify(args, raw) -> dict:
    """Identification (Sec. 3.2): precision of the selected neighbours w.r.t. the true groups, per-client AUC
    of the proxy similarities (same group vs other), and what random selection of the same sizes would
    score."""
    out = []
    for seed in args.seeds:
        cfg = with_algorithm(raw, "afind")
        cfg.update(seed=seed, rounds=args.identify_rounds)
        cfg["partition"] = {"kind": "grouped", "num_clients": args.clients, "num_groups": 4}
        built = build_run(parse_config(cfg))
        algorithm, data = built.algorithm, built.context.data
        labels = [
            frozenset(np.unique(data.y_train[torch.as_tensor(ix)].cpu().numpy())) for ix in data.client_train
        ]
        n = len(labels)
        same = torch.tensor([[a == b and i != j for j, b in enumerate(labels)] for i, a in enumerate(labels)])
        other = ~same & ~torch.eye(n, dtype=torch.bool)
        random_precision = float((same.sum(1).double() / (n - 1)).mean())
        per_round = []
        for t in range(1, args.identify_rounds + 1):
            metrics = built.round(t).row()
            chosen, sim = algorithm.selector.previous.cpu(), algorithm.selector.sim.cpu()
            precision = float((chosen & same).sum() / chosen.sum().clamp_min(1))
            aucs = []
            for i in range(n):
                pos, neg = sim[i][same[i]], sim[i][other[i]]
                if len(pos) and len(neg):
                    gt = (pos[:, None] > neg[None, :]).double().mean()
                    eq = (pos[:, None] == neg[None, :]).double().mean()
                    aucs.append(float(gt + 0.5 * eq))
            recall = float((chosen & same).sum() / same.sum())
            per_round.append(
                {
                    "round": t,
                    "selected": metrics["selected_mean"],
                    "precision": precision,
                    "recall": recall,
                    "auc": statistics.fmean(aucs),
                }
            )
        out.append({"seed": seed, "random_precision": random_precision, "rounds": per_round})
        print(
            f"  seed {seed}: round 1 precision {per_round[0]['precision']:.2f} auc {per_round[0]['auc']:.3f}"
        )
    return {"seeds": out}


def section_speed(args, raw) -> dict:
    """Rounds per second (training + selection, no evaluation) with many clients, batched executor."""
    cfg = copy.deepcopy(raw)
    cfg["partition"] = {"kind": "dirichlet", "num_clients": args.speed_clients, "alpha": 0.5}
    cfg["data"]["train_limit"] = args.speed_clients * 200
    cfg["engine"] = {"executor": "batched", "threads": 1}
    variants = {
        "gossip": with_algorithm(cfg, "gossip"),
        "afind (standard)": with_algorithm(cfg, "afind", neighbor_mode="standard"),
        "afind (literal)": with_algorithm(cfg, "afind"),
    }
    out = {}
    for label, variant in variants.items():
        built = build_run(parse_config(variant))
        algorithm = built.algorithm
        scoring = [0.0]
        if hasattr(algorithm, "selector"):
            begin = algorithm.selector.begin

            def timed(*a, _begin=begin, _scoring=scoring, **k):
                start = time.perf_counter()
                try:
                    return _begin(*a, **k)
                finally:
                    _scoring[0] += time.perf_counter() - start

            algorithm.selector.begin = timed
        built.round(1)  # warm-up (and AFIND+'s cold start)
        scoring[0] = 0.0
        rounds = args.speed_rounds
        start = time.perf_counter()
        selected = [built.round(t).row().get("selected_mean", float("nan")) for t in range(2, 2 + rounds)]
        seconds = (time.perf_counter() - start) / rounds
        start = time.perf_counter()
        built.evaluate(1 + rounds)
        out[label] = {
            "seconds_per_round": seconds,
            "rounds_per_second": 1 / seconds,
            "scoring_seconds_per_round": scoring[0] / rounds,
            "evaluation_seconds": time.perf_counter() - start,
            "selected_mean": statistics.fmean(selected),
        }
        print(
            f"  {label:18s} {1 / seconds:.2f} rounds/s, scoring {scoring[0] / rounds:.2f} s/round", flush=True
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "sections", nargs="+", choices=["identify", "table1", "topology", "ablation", "dp", "hosts", "speed"]
    )
    parser.add_argument("--out", type=Path, default=Path("runs/afind-experiments"))
    parser.add_argument("--seeds", type=lambda text: [int(s) for s in text.split(",")], default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--train-limit", type=int, default=3000)
    parser.add_argument("--test-limit", type=int, default=2000)
    parser.add_argument("--identify-rounds", type=int, default=10)
    parser.add_argument("--speed-clients", type=int, default=100)
    parser.add_argument("--speed-rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = base_config(args)
    for section in args.sections:
        print(f"## {section}", flush=True)
        began = time.perf_counter()
        if section == "table1":
            result = section_table1(args, raw)
            print(table("Table 1 analogue, full graph", list(PARTITIONS), result, "best"))
            print(table("Table 1 analogue, full graph", list(PARTITIONS), result, "last"))
        elif section == "topology":
            partial = {"kind": "partial", "p": 0.5}
            names = ["gossip", "pens", "federico", "afind"]
            result = section_table1(args, raw, ["path c=2", "dir 0.1"], partial, names)
            print(table("Table 3 analogue, partial graph ER(0.5)", ["path c=2", "dir 0.1"], result, "best"))
        elif section == "ablation":
            result = section_ablation(args, raw)
            print(table("Table 2 analogue", ["path c=2", "dir 0.1"], result, "best"))
        elif section == "dp":
            result = section_dp(args, raw)
            print(
                table(
                    "Table 4 analogue (noise on the proxies, C = 1)", ["path c=2", "dir 0.1"], result, "best"
                )
            )
        elif section == "hosts":
            result = section_hosts(args, raw)
            print(table("Fig. 5 analogue", ["path c=2", "dir 0.1"], result, "best"))
        elif section == "identify":
            result = section_identify(args, raw)
        else:
            result = section_speed(args, raw)
        print(f"({section}: {time.perf_counter() - began:.0f} s)", flush=True)
        (args.out / f"{section}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
