"""Robust aggregation on the stacked state against a per-client loop over state dicts, Flower's way.

    python -m benchmarks.robust                                  # 1,000 clients x 1M parameters
    python -m benchmarks.robust --clients 200 --params 100000    # smaller

``--clients`` updates of ``--params`` float32 parameters in ``--layers`` tensors, random normal, are
aggregated by fedge's stages (:mod:`fedge.aggregation.robust`, one server output, the rows stacked
``[clients, ...]`` per tensor) and by the baseline: the same updates as a list of per-client state dicts
of numpy arrays (views of the stacked rows, so the state is held once), reduced by Flower's own
functions where it has them (``aggregate_median``, ``aggregate_trimmed_avg``, ``aggregate_krum``, from
``flwr.server.strategy.aggregate``) and, for the geometric median, which Flower lacks, by the
smoothed Weiszfeld loop written over the state dicts as fast as we could (:func:`weiszfeld_loop`: numpy
and BLAS, one client at a time, each layer in place). Flower's Krum computes its ``n^2`` distances one
pair at a time in Python; at more than ``--krum-clients`` clients it is timed on that many and scaled by
``(n / m)^2`` (marked "scaled" in the table). Each column is timed once after both sides agree on a
small case; the largest difference of the results is reported. Memory: the stacked state (4 GB at the
default size) plus Flower's per-layer copies (``np.asarray`` of one layer over the clients and its
partition: two layers' worth).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch
from scipy.linalg.blas import get_blas_funcs
from threadpoolctl import threadpool_limits

from fedge.aggregation import Updates
from fedge.aggregation.robust import (
    CANCELLATION,
    GeometricMedian,
    Krum,
    Median,
    RobustReducer,
    TrimmedMean,
)
from fedge.tensors import Tensors

TRIM = 0.1
BYZANTINE = 10
ITERATIONS, EPS, TOLERANCE = 100, 1e-6, 1e-6


def stacked(clients: int, params: int, layers: int, seed: int = 0) -> Tensors:
    """Random updates, ``layers`` tensors of about ``params / layers`` values each."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [params // layers + (1 if i < params % layers else 0) for i in range(layers)]
    return {f"layer{i}": torch.randn(clients, size, generator=gen) for i, size in enumerate(sizes)}


def state_dicts(rows: Tensors) -> list[list[np.ndarray]]:
    """Each client's layers as numpy views of the stacked rows (Flower's ``NDArrays``)."""
    n = len(next(iter(rows.values())))
    return [[t[i].numpy() for t in rows.values()] for i in range(n)]


def weiszfeld_loop(results: list[list[np.ndarray]]) -> list[np.ndarray]:
    """RFA's smoothed Weiszfeld over per-client state dicts (uniform weights), one client at a time, as
    fast as we could make it: each weighted sum accumulated in place by BLAS ``axpy``, the distances to
    the mean from the differences and those to each later point expanded about the mean (``||x - m||^2 -
    2 (x - m).u + ||u||^2``, ``u = v - m``: one dot product per layer), as fedge expands them (exactly
    from the differences where the expansion's terms would cancel, :data:`CANCELLATION`); the BLAS on
    one thread, faster on these small calls than its threads."""
    n = len(results)
    alpha = np.full(n, 1.0 / n)
    axpy = get_blas_funcs("axpy", results[0][:1])

    def weighted(beta: np.ndarray) -> list[np.ndarray]:
        total = [np.zeros_like(layer) for layer in results[0]]
        for b, layers in zip(beta, results, strict=True):
            for acc, layer in zip(total, layers, strict=True):
                axpy(layer, acc, a=b)
        return total

    def dot(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return sum(float(np.dot(x, y)) for x, y in zip(a, b, strict=True))

    scratch = [np.empty_like(layer) for layer in results[0]]  # the differences, without an allocation each

    def squared(v: list[np.ndarray]) -> np.ndarray:
        def one(layers: list[np.ndarray]) -> float:
            return sum(
                float(np.dot(d, d))
                for d in (np.subtract(x, c, out=t) for x, c, t in zip(layers, v, scratch, strict=True))
            )

        return np.array([one(s) for s in results])

    with threadpool_limits(1, user_api="blas"):
        mean = weighted(alpha)
        start = squared(mean)
        norms = np.sqrt(start) + np.sqrt(dot(mean, mean))  # ||x||, at most (the triangle inequality)
        dist = np.sqrt(start)
        objective = float(alpha @ dist)
        v, exact = mean, False
        for _ in range(ITERATIONS):
            beta = alpha / np.maximum(EPS, dist)
            v = weighted(beta / beta.sum())
            u = [a - m for a, m in zip(v, mean, strict=True)]
            step = dot(u, u)
            cross = np.array([dot(s, u) for s in results]) - dot(mean, u)
            expanded = np.maximum(start - 2 * cross + step, 0)
            terms = start + 2 * (norms + np.sqrt(dot(mean, mean))) * np.sqrt(step) + step
            exact = exact or bool((terms > CANCELLATION * expanded).any())
            dist = np.sqrt(squared(v) if exact else expanded)
            improved = float(alpha @ dist)
            if abs(objective - improved) <= TOLERANCE * improved:
                break
            objective = improved
    return v


def flower(name: str) -> Callable[[list[list[np.ndarray]]], list[np.ndarray]]:
    """The baseline for aggregator ``name``: Flower's function (every client 1 example), or our loop."""
    from flwr.server.strategy import aggregate as fl

    def results(states: list[list[np.ndarray]]) -> list[tuple[list[np.ndarray], int]]:
        return [(s, 1) for s in states]

    return {
        "median": lambda s: fl.aggregate_median(results(s)),
        "trimmed_mean": lambda s: fl.aggregate_trimmed_avg(results(s), TRIM),
        "krum": lambda s: fl.aggregate_krum(results(s), BYZANTINE, 0),
        "geometric_median": weiszfeld_loop,
    }[name]


def stage(name: str) -> RobustReducer:
    return {
        "median": Median(),
        "trimmed_mean": TrimmedMean(TRIM),
        "krum": Krum(BYZANTINE),
        "geometric_median": GeometricMedian(ITERATIONS, EPS, TOLERANCE),
    }[name]


def fedge_reduce(name: str, rows: Tensors) -> Tensors:
    n = len(next(iter(rows.values())))
    return stage(name).reduce(Updates.of("server", 0, rows, torch.full((n,), 1.0 / n, dtype=torch.float64)))


def difference(ours: Tensors, theirs: list[np.ndarray]) -> float:
    return max(float(np.abs(o.numpy() - t).max()) for o, t in zip(ours.values(), theirs, strict=True))


def seconds(fn: Callable[..., object], *args: object) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument(
        "--krum-clients", type=int, default=100, help="Flower's Krum timed on at most this many"
    )
    parser.add_argument("--only", nargs="*", default=["median", "trimmed_mean", "krum", "geometric_median"])
    args = parser.parse_args()
    small = stacked(2 * BYZANTINE + 5, 1000, 2, seed=1)
    for name in args.only:  # both sides agree before anything is timed
        gap = difference(fedge_reduce(name, small), flower(name)(state_dicts(small)))
        assert gap < 1e-4, f"{name}: fedge and the baseline differ by {gap}"
    rows = stacked(args.clients, args.params, args.layers)
    states = state_dicts(rows)
    print(
        f"{args.clients} clients x {args.params:,} float32 parameters ({args.layers} tensors), "
        f"{torch.get_num_threads()} threads"
    )
    print("| aggregator | fedge (s) | per-client loop (s) | loop / fedge | max difference |")
    print("|---|---:|---:|---:|---:|")
    for name in args.only:
        ours_s, ours = seconds(fedge_reduce, name, rows)
        subset = states
        if name == "krum" and args.clients > args.krum_clients:
            subset = states[: args.krum_clients]
        theirs_s, theirs = seconds(flower(name), subset)
        note, gap = "", "n/a (subset)"
        if subset is states:
            gap = f"{difference(ours, theirs):.1e}"  # type: ignore[arg-type]
        else:
            theirs_s *= (args.clients / len(subset)) ** 2
            note = f" (scaled from {len(subset)})"
        print(
            f"| {name} | {ours_s:.2f} | {theirs_s:.2f}{note} | {theirs_s / ours_s:.1f} | {gap} |", flush=True
        )


if __name__ == "__main__":
    main()
