"""W8: a cross-device population. 1,000,000 clients of 20 MNIST samples each (indices resampled from the
60,000 images, drawn only when a client is sampled), 1,000 sampled per round, FedAvg and CSE-FSL; round
time and peak RSS against a population of 1,000 clients with the same cohort size.

Each (algorithm, population) pair runs in a fresh child process, so one's memory does not show in the
other's peak. The run is built as :func:`fedge.runner.loop.build_run` builds it, except that the clients are a
:class:`~fedge.data.federated.ResampledClients` population instead of a partition of the data.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.measure import RssSampler, load_average, median, peak_rss_bytes, reset_peak_rss, rss_bytes
from fedge.algorithms import ALGORITHMS
from fedge.algorithms.base import Context
from fedge.api import resolve_config
from fedge.comm import Ledger, Network
from fedge.data.federated import FederatedData, ResampledClients
from fedge.data.sources import load_dataset
from fedge.engine import make_executor
from fedge.runner.loop import Built, model_factory
from fedge.system import SystemModel

ROOT = Path(__file__).resolve().parents[1]
POPULATIONS = (1_000, 1_000_000)
COHORT = 1_000
SAMPLES = 20
ROUNDS = 3  # the first is a warm-up


def _raw(algorithm: str, population: int) -> dict[str, Any]:
    if algorithm == "fedavg":
        model = {"name": "mlp", "options": {"hidden": [200]}}
        alg = {"name": "fedavg", "fraction": COHORT / population, "batch_size": SAMPLES}
    else:
        model = {"name": "lenet5", "cut": 2, "aux": {"kind": "linear"}}
        alg = {"name": "cse_fsl", "h": 1, "batch_size": SAMPLES}
        if population > COHORT:
            alg |= {"participation": "without_replacement", "clients_per_round": COHORT}
    return {
        "seed": 0,
        "data": {"name": "mnist", "test_limit": 1000},
        "partition": {"kind": "iid", "num_clients": population},
        "model": model,
        "algorithm": {**alg, "optimizer": {"lr": 0.05}},
        "engine": {"executor": "batched", "threads": 1, "retain_memory": False},
        "output": {"plots": False},
    }


def build_population(algorithm: str, population: int) -> Built:
    """The run of ``algorithm`` on a lazily drawn population of ``population`` clients."""
    config = resolve_config(_raw(algorithm, population), [])
    dataset = load_dataset(config.data, config.seed)
    train = ResampledClients(population, SAMPLES, dataset.num_train, config.seed)
    test = ResampledClients(population, SAMPLES, dataset.num_test, config.seed + 1)
    data = FederatedData(dataset, train, test, config.seed, "cpu")
    ctx = Context(
        config=config,
        data=data,
        build_model=model_factory(config, dataset.input_shape, dataset.num_classes),
        executor=make_executor("batched"),
        network=Network(Ledger()),
        system=SystemModel(config.system, population, config.seed),
        device=torch.device("cpu"),
        seed=config.seed,
    )
    return Built(config, ctx, ALGORITHMS[config.algorithm.name](ctx, config.algorithm))


def probe(algorithm: str, population: int) -> dict[str, Any]:
    """Build, a warm-up round, then timed rounds under an RSS sampler."""
    began = time.perf_counter()
    built = build_population(algorithm, population)
    build_seconds = time.perf_counter() - began
    built.round(1)
    reset_peak_rss()
    before = rss_bytes()
    seconds = []
    with RssSampler() as sampler:
        for t in range(2, ROUNDS + 1):
            start = time.perf_counter()
            built.round(t)
            seconds.append(time.perf_counter() - start)
    return {
        "population": population,
        "cohort": COHORT,
        "build_seconds": build_seconds,
        "round_seconds": median(seconds),
        "rounds_seconds": seconds,
        "rss_before_rounds": before,
        "peak_rss": max(peak_rss_bytes(), sampler.peak),
    }


def run_population(args: argparse.Namespace) -> dict[str, Any]:
    """Both algorithms at both population sizes, each in a child process; the ratios."""
    out: dict[str, Any] = {
        "description": f"{POPULATIONS[-1]:,} clients x {SAMPLES} resampled MNIST, {COHORT:,} per round",
        "algorithms": {},
    }
    for algorithm in ("fedavg", "cse_fsl"):
        results = {}
        for population in POPULATIONS:
            print(f"  W8 {algorithm}, population {population:,}", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "benchmarks.population", algorithm, str(population)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
            results[population] = json.loads(done.stdout.strip().splitlines()[-1])
            results[population]["load_average"] = load_average()
        small, large = results[POPULATIONS[0]], results[POPULATIONS[-1]]
        out["algorithms"][algorithm] = {
            "by_population": {str(k): v for k, v in results.items()},
            "round_time_ratio": large["round_seconds"] / small["round_seconds"],
            "peak_rss_ratio": large["peak_rss"] / small["peak_rss"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    print(json.dumps(probe(argv[0], int(argv[1]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
