"""AFIND+'s per-round selection trace (metrics rows) and the report's neighbour-selection section."""

from __future__ import annotations

import math

import pytest

import fedge
from fedge.report.page import render

CONFIG = {
    "seed": 1,
    "rounds": 5,
    "data": {"name": "synthetic", "num_train": 1200, "num_test": 200, "shape": [1, 6, 6], "num_classes": 4},
    "partition": {"kind": "dirichlet", "num_clients": 16, "alpha": 0.3},
    "model": {"name": "mlp", "options": {"hidden": [16]}},
    "algorithm": {"name": "afind", "local_epochs": 1, "batch_size": 16, "k0": 8},
    "eval": {"every": 5},
}


@pytest.mark.ci
def test_the_trace_shows_the_threshold_shrinking_the_literal_coreset(tmp_path):
    """Eq. 10 sums the entropy over the coreset, so a smaller coreset raises the next threshold (up to
    tau / 2): from the cold start's k0 the coreset shrinks, and never past what the threshold lets through
    (the scores sum to 1, so at most floor(1 / theta) reach it)."""
    result = fedge.run({**CONFIG, "output": {"dir": str(tmp_path), "plots": False}})
    rows = result.metrics
    tau = 0.5
    for row in rows:
        assert row["selected_min"] <= row["selected_mean"] <= row["selected_max"]
        assert 0 < row["theta_min"] <= row["theta_mean"] <= row["theta_max"] <= tau / 2
        assert row["passing_bound_mean"] >= math.floor(1 / row["theta_max"])
        assert 0 < row["weight_self_mean"] <= 1 and 0 < row["weight_peer_max_mean"] <= 1
        assert 0 < row["score_best_mean"] <= 1
    assert rows[0]["selected_mean"] == 8  # the cold start: top k0
    assert rows[-1]["selected_mean"] < rows[0]["selected_mean"]
    assert rows[-1]["theta_mean"] > rows[1]["theta_mean"]
    assert rows[-1]["sim_selected_mean"] > rows[-1]["sim_others_mean"]  # the kept ones are the similar ones


@pytest.mark.ci
def test_the_report_draws_the_selection_of_runs_that_carry_it(tmp_path):
    traced = fedge.run({**CONFIG, "rounds": 2, "output": {"dir": str(tmp_path / "a"), "plots": False}})
    page = render(traced.run_dir)
    assert "<h2>Neighbour selection</h2>" in page and "neighbour selection' src='data:image/png" in page
    plain = {**CONFIG, "rounds": 1, "algorithm": {"name": "fedavg"}}
    untraced = fedge.run({**plain, "output": {"dir": str(tmp_path / "b"), "plots": False}})
    assert "Neighbour selection" not in render(untraced.run_dir)
