"""The robust reducers and norm_bound (fedge.aggregation.robust): each equals a hand-written numpy
reference and Flower's implementation where it has one, degenerates to the plain mean where its paper
says, gives each receiver what it gives that receiver's rows alone, reports whom it kept, charges the
clock, refuses bad options naming the key, and runs at a FedAvg server, HFedAvg's edges and gossip's
peers on both executors with one result."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cases import final_state, staged

import fedge
from fedge.aggregation import Updates, WeightedMean
from fedge.aggregation.private import Clip
from fedge.aggregation.robust import (
    CenteredClip,
    GeometricMedian,
    Krum,
    Median,
    MultiKrum,
    NormBound,
    TrimmedMean,
)
from fedge.aggregation.stage import StageRun
from fedge.config import SystemConfig
from fedge.errors import ConfigError
from fedge.system import SystemModel


def stacked(n: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(n, 4, 3, generator=gen).to(dtype),
        "b": torch.randn(n, 3, generator=gen).to(dtype),
        "count": torch.randint(0, 9, (n,), generator=gen),
    }


def flat(rows: dict[str, torch.Tensor]) -> np.ndarray:
    """Every floating tensor of each row as one numpy vector ``[n, d]``."""
    return np.concatenate([rows[k].reshape(len(rows[k]), -1).numpy() for k in ("w", "b")], axis=1)


def flat_out(out: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([out["w"].reshape(-1).numpy(), out["b"].reshape(-1).numpy()])


def uniform(n: int) -> torch.Tensor:
    return torch.full((n,), 1.0 / n, dtype=torch.float64)


def reduce(reducer, rows, weights=None, reference=None, site="server", senders=None):
    weights = uniform(len(rows["w"])) if weights is None else weights
    return reducer.reduce(Updates.of(site, 1, rows, weights, reference, senders))


# ----- hand-written references (loops over coordinates and rows, numpy float64) -------------------


def ref_median(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[1])
    for j in range(x.shape[1]):
        column = sorted(x[:, j])
        n = len(column)
        out[j] = column[n // 2] if n % 2 else (column[n // 2 - 1] + column[n // 2]) / 2
    return out


def ref_trimmed(x: np.ndarray, b: int) -> np.ndarray:
    out = np.empty(x.shape[1])
    for j in range(x.shape[1]):
        column = sorted(x[:, j])
        kept = column[b : len(column) - b]
        out[j] = sum(kept) / len(kept)
    return out


def ref_krum_scores(x: np.ndarray, f: int) -> list[float]:
    n = len(x)
    scores = []
    for i in range(n):
        distances = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(distances[: n - f - 2]))
    return scores


def ref_multi_krum(x: np.ndarray, f: int, m: int) -> tuple[np.ndarray, list[int]]:
    scores = ref_krum_scores(x, f)
    best = sorted(range(len(x)), key=lambda i: (scores[i], i))[:m]
    return np.mean(x[best], axis=0), sorted(best)


def ref_geometric_median(x: np.ndarray, a: np.ndarray, iterations: int, eps: float, tol: float) -> np.ndarray:
    a = a / a.sum()
    v = sum(a[i] * x[i] for i in range(len(x)))
    objective = sum(a[i] * np.linalg.norm(v - x[i]) for i in range(len(x)))
    for _ in range(iterations):
        beta = np.array([a[i] / max(eps, np.linalg.norm(v - x[i])) for i in range(len(x))])
        v = sum(beta[i] * x[i] for i in range(len(x))) / beta.sum()
        improved = sum(a[i] * np.linalg.norm(v - x[i]) for i in range(len(x)))
        if abs(objective - improved) <= tol * improved:
            break
        objective = improved
    return v


def ref_centered_clip(x: np.ndarray, v: np.ndarray, tau: float, iterations: int) -> np.ndarray:
    for _ in range(iterations):
        steps = [(xi - v) * min(1.0, tau / np.linalg.norm(xi - v)) for xi in x]
        v = v + sum(steps) / len(x)
    return v


# ----- each equals its reference -----------------------------------------------------------------


@pytest.mark.parametrize("n", [7, 8])
def test_the_median_and_trimmed_mean_equal_per_coordinate_loops(n):
    rows = stacked(n)
    x = flat(rows)
    np.testing.assert_allclose(flat_out(reduce(Median(), rows)), ref_median(x), rtol=0, atol=1e-6)
    for trim, b in [(0.25, int(0.25 * n)), (2, 2), (0.0, 0)]:
        got = flat_out(reduce(TrimmedMean(trim), rows))
        np.testing.assert_allclose(got, ref_trimmed(x, b), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("f", "m"), [(0, 1), (1, 1), (2, 3), (1, None)])
def test_krum_and_multi_krum_equal_the_explicit_scores(f, m):
    rows = stacked(9, seed=1)
    rows["w"][4] += 10.0  # one far row: never chosen
    x = flat(rows)
    reducer = Krum(f) if m == 1 else MultiKrum(f, m)
    got = reduce(reducer, rows, senders=tuple(range(50, 59)))
    want, best = ref_multi_krum(x, f, 9 - f if m is None else m)
    np.testing.assert_allclose(flat_out(got), want, rtol=0, atol=1e-6)
    report = reducer.reports[0]
    np.testing.assert_allclose(report.scores, ref_krum_scores(x, f), rtol=1e-9)
    assert report.chosen == tuple(50 + i for i in best) and 54 not in report.chosen


def test_the_geometric_median_equals_weiszfeld_by_hand_with_the_site_weights():
    rows = stacked(8, seed=2)
    weights = torch.rand(8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    weights /= weights.sum()
    for iterations, tol in [(3, 0.0), (100, 1e-6), (0, 0.0)]:
        reducer = GeometricMedian(iterations, 1e-6, tol)
        got = flat_out(reduce(reducer, rows, weights))
        want = ref_geometric_median(flat(rows), weights.numpy(), iterations, 1e-6, tol)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        assert reducer.reports[0].iterations <= iterations


def test_the_geometric_median_takes_the_differences_where_the_expanded_distances_would_cancel():
    rows = stacked(8, seed=2)
    far = {k: v + 1e8 if v.is_floating_point() else v for k, v in rows.items()}  # norms >> distances
    for data, mean_pass, per_step in ((rows, 6, 4), (far, 11, 5)):  # expanded; exact (see its docstring)
        reducer = GeometricMedian()
        got = flat_out(reduce(reducer, data))
        want = ref_geometric_median(flat(data), np.full(8, 1 / 8), 100, 1e-6, 1e-6)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        report = reducer.reports[0]
        assert report.flops == (mean_pass + per_step * report.iterations) * 8 * 15


def test_centered_clip_equals_the_explicit_iteration_from_the_reference():
    rows = stacked(6, seed=3)
    reference = {"w": torch.zeros(4, 3, dtype=torch.float64), "b": torch.ones(3, dtype=torch.float64)}
    reference["count"] = torch.tensor(0)
    v = flat({k: reference[k][None] for k in ("w", "b")})[0]
    for tau, iterations in [(0.5, 1), (1.5, 3)]:
        got = flat_out(reduce(CenteredClip(tau, iterations), rows, reference=reference))
        np.testing.assert_allclose(got, ref_centered_clip(flat(rows), v, tau, iterations), rtol=0, atol=1e-6)


def test_each_equals_flowers_aggregate_where_flower_has_one():
    flwr = pytest.importorskip("flwr.server.strategy.aggregate")
    rows = stacked(11, seed=4, dtype=torch.float32)
    results = [([rows["w"][i].numpy(), rows["b"][i].numpy()], 10) for i in range(11)]

    def close(got: dict[str, torch.Tensor], want: list[np.ndarray]) -> None:
        np.testing.assert_allclose(got["w"].numpy(), want[0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(got["b"].numpy(), want[1], rtol=0, atol=1e-6)

    close(reduce(Median(), rows), flwr.aggregate_median(results))
    close(reduce(TrimmedMean(0.2), rows), flwr.aggregate_trimmed_avg(results, 0.2))
    close(reduce(Krum(2), rows), flwr.aggregate_krum(results, 2, 0))
    # Flower's multi-Krum weighs the kept rows by their sample counts: equal counts, the unweighted mean
    close(reduce(MultiKrum(2, 4), rows), flwr.aggregate_krum(results, 2, 4))


def test_degenerate_options_give_the_plain_mean():
    rows = stacked(7, seed=5)
    mean = WeightedMean().reduce(Updates.of("server", 1, rows, uniform(7)))
    reference = {k: v[0] for k, v in rows.items()}
    for reducer in (TrimmedMean(0), TrimmedMean(0.0), MultiKrum(0, 7), CenteredClip(tau=1e9)):
        got = reduce(reducer, rows, reference=reference)
        for k in ("w", "b"):
            torch.testing.assert_close(got[k], mean[k], rtol=0, atol=1e-12)
        assert int(got["count"]) == int(rows["count"].max())  # counters as the server's mean takes them
    one = {k: v[:1] for k, v in rows.items()}  # one row is its own median and geometric median
    for reducer in (Median(), GeometricMedian()):
        assert torch.equal(reduce(reducer, one, torch.ones(1, dtype=torch.float64))["w"], one["w"][0])


def test_the_weights_choose_the_rows_and_scale_the_result_and_only_rfa_weighs_them():
    rows = stacked(6, seed=6)
    weights = torch.tensor([0.1, 0.0, 0.2, 0.05, 0.15, 0.0], dtype=torch.float64)  # sums to 0.5
    chosen = {k: v[[0, 2, 3, 4]] for k, v in rows.items()}
    for reducer in (Median(), TrimmedMean(1), CenteredClip(0.5, 2)):
        reference = {"w": torch.zeros(4, 3, dtype=torch.float64), "b": torch.zeros(3, dtype=torch.float64)}
        got = reduce(reducer, rows, weights, reference, site="buffer")
        assert reducer.reports[0].rows == (0, 2, 3, 4)
        alone = reduce(reducer, chosen, uniform(4), reference, site="buffer")
        torch.testing.assert_close(got["w"], 0.5 * alone["w"], rtol=0, atol=1e-12)
    got = reduce(GeometricMedian(), rows, weights)
    want = ref_geometric_median(flat(chosen), weights[[0, 2, 3, 4]].numpy(), 100, 1e-6, 1e-6)
    np.testing.assert_allclose(flat_out(got), 0.5 * want, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "reducer",
    [Median(), TrimmedMean(1), MultiKrum(0, 2), GeometricMedian(), CenteredClip(0.7, 2)],
    ids=lambda r: r.name,
)
def test_per_receiver_outputs_equal_the_reducer_on_each_receivers_rows(reducer):
    rows = stacked(8, seed=7)
    support = torch.tensor(  # peers of different degrees: 4, 5, 4 and 6 rows
        [
            [1, 1, 0, 1, 0, 0, 1, 0],
            [0, 1, 1, 1, 1, 1, 0, 0],
            [1, 0, 0, 0, 1, 1, 0, 1],
            [1, 1, 1, 0, 1, 1, 1, 0],
        ]
    )
    weights = support * torch.rand(4, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    weights /= weights.sum(dim=1, keepdim=True)
    reference = {k: v[:4] + 0.1 for k, v in rows.items()}  # each receiver's own model
    got = reducer.reduce(Updates.of("peer", 1, rows, weights, reference))
    assert "count" not in got  # peers keep their own counters, as their mean leaves them
    for o in range(4):
        mine = torch.nonzero(weights[o]).flatten()
        alone = reducer.reduce(
            Updates.of(
                "server",
                1,
                {k: v[mine] for k, v in rows.items()},
                weights[o, mine],
                {k: v[o] for k, v in reference.items()},
            )
        )
        for k in ("w", "b"):
            torch.testing.assert_close(got[k][o], alone[k], rtol=0, atol=1e-9)


def test_the_median_reports_each_rows_share_and_an_outlier_has_none():
    rows = stacked(5, seed=8)
    rows["b"][3] += 100.0
    rows["w"][3] += 100.0
    reducer = Median()
    reduce(reducer, rows, senders=(10, 11, 12, 13, 14))
    report = reducer.reports[0]
    assert report.kept[3] == 0 and 13 not in report.chosen
    assert sum(report.kept) == pytest.approx(1.0)  # an odd count: one row per coordinate
    trimmed = TrimmedMean(1)
    reduce(trimmed, rows)
    assert trimmed.reports[0].kept[3] == 0 and sum(trimmed.reports[0].kept) == pytest.approx(3.0)


def test_the_compute_is_charged_to_the_clock_krum_quadratically():
    seconds = {}
    for n in (6, 12):
        system = SystemModel(SystemConfig(), n, 0)
        reducer = Krum(1)
        reducer.bind(StageRun("server", 0, None, None, system))
        reduce(reducer, stacked(n))
        assert system.clock.seconds_by_phase["server_compute"] == system.clock.seconds > 0
        assert reducer.reports[0].flops == (2 * n * n + n + 1) * 15
        seconds[n] = system.clock.seconds
    assert seconds[12] / seconds[6] == pytest.approx((2 * 144 + 13) / (2 * 36 + 7))
    system = SystemModel(SystemConfig(), 8, 0)
    reducer = Median()
    reducer.bind(StageRun("buffer", 0, None, None, system))
    reduce(reducer, stacked(8), site="buffer")
    assert system.clock.seconds == 0 and system.clock.joules > 0  # the buffer's time is its queue's


def test_norm_bound_is_the_clip_with_its_bound_and_is_refused_at_peers():
    rows = stacked(6, seed=9)
    reference = {k: v[0] for k, v in rows.items()}
    weights = torch.rand(6, dtype=torch.float64)
    bounded = NormBound(0.5).apply(Updates.of("server", 1, rows, weights, reference))
    clipped = Clip(0.5).apply(Updates.of("server", 1, rows, weights, reference))
    x, ref = flat(bounded.parts[0].rows), flat({k: reference[k][None] for k in ("w", "b")})
    assert np.all(np.linalg.norm(x - ref, axis=1) <= 0.5 + 1e-9)
    for k in rows:
        assert torch.equal(bounded.parts[0].rows[k], clipped.parts[0].rows[k])
    assert torch.equal(bounded.parts[0].weights, weights)
    with pytest.raises(ConfigError, match="peers"):
        NormBound(0.5).apply(Updates.of("peer", 1, rows, torch.eye(6, dtype=torch.float64), reference))


def test_krum_with_too_few_rows_is_refused_naming_the_option():
    with pytest.raises(ConfigError) as error:
        reduce(Krum(2), stacked(6))
    assert error.value.key == "aggregation.stages.options.byzantine" and "2f + 2" in str(error.value)


@pytest.mark.parametrize(
    ("stage", "key"),
    [
        ({"name": "trimmed_mean", "options": {"trim": 0.7}}, "aggregation.stages.0.options.trim"),
        ({"name": "trimmed_mean", "options": {"trimm": 0.1}}, "aggregation.stages.0.options.trimm"),
        ({"name": "multi_krum", "options": {"byzantine": -1}}, "aggregation.stages.0.options.byzantine"),
        ({"name": "krum", "options": {"keep": 3}}, "aggregation.stages.0.options.keep"),
        ({"name": "geometric_median", "options": {"eps": 0}}, "aggregation.stages.0.options.eps"),
        ({"name": "centered_clip", "options": {"tau": "big"}}, "aggregation.stages.0.options.tau"),
        ({"name": "norm_bound", "options": {"bound": -1}}, "aggregation.stages.0.options.bound"),
    ],
)
def test_a_bad_option_is_refused_in_one_line_naming_it(stage, key):
    with pytest.raises(ConfigError) as error:
        fedge.load_config(None, [f"aggregation.stages={json.dumps([stage])}"])
    assert error.value.key == key and "\n" not in str(error.value)


# ----- in runs: a server, HFedAvg's edges, gossip's peers ----------------------------------------

RUNS = {
    "fedavg": ({"name": "fedavg", "batch_size": 16, "fraction": 1.0}, "server"),
    "hfedavg": (
        {
            "name": "hfedavg",
            "cells": 2,
            "split": "partition",
            "edge_rounds": 1,
            "local_steps": 2,
            "batch_size": 8,
        },
        "edge",
    ),
    "gossip": ({"name": "gossip", "batch_size": 16, "peers": 2}, "peer"),
}


@pytest.mark.parametrize("family", list(RUNS))
def test_the_median_runs_at_its_site_on_both_executors_with_one_result(tmp_path, family):
    algorithm, site = RUNS[family]
    stages = [{"name": "median", "at": [site]}]
    runs = {e: fedge.run(staged(tmp_path, algorithm, stages, e)) for e in ("sequential", "batched")}
    assert runs["sequential"].summary["aggregation"][site] == ["median"]
    states = {name: final_state(run.run_dir) for name, run in runs.items()}
    for k, value in states["sequential"].items():
        torch.testing.assert_close(states["batched"][k], value, rtol=0, atol=1e-5)
    mean = final_state(fedge.run(staged(tmp_path / "mean", algorithm, [], "sequential")).run_dir)
    assert any(not torch.allclose(mean[k], states["sequential"][k]) for k in mean)
