"""The privacy ledger in a run: epsilon in every round's record, the summary and privacy.csv, a budget
that stops the run before it is crossed, and releases that survive a resume. The mechanism is a user's
stage (the extension API) that records one client-level Gaussian release per aggregation, so these
tests depend on the ledger's plumbing alone."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cases import tiny

import fedge
from fedge.aggregation import Transform, Updates
from fedge.aggregation.stage import StageRun
from fedge.errors import ConfigError
from fedge.extend import register_stage
from fedge.privacy import PrivacyLedger, Release, epsilon


class RecordsARelease(Transform):
    """Leaves the updates as they are and records a release of noise multiplier ``sigma``."""

    def __init__(self, sigma: float = 1.0):
        self.sigma = sigma

    def bind(self, run: StageRun) -> None:
        self.privacy = run.privacy

    def apply(self, updates: Updates) -> Updates:
        assert self.privacy is not None
        self.privacy.record(Release(updates.round, "update", "client", "gaussian", self.sigma))
        return updates


register_stage("test_records_a_release", RecordsARelease)


def private(tmp_path: Path, rounds: int, sigma: float = 1.0, **stop: float) -> dict:
    config = tiny("fedavg", tmp_path, rounds)
    config["aggregation"] = {"stages": [{"name": "test_records_a_release", "options": {"sigma": sigma}}]}
    config["stop"] = dict(stop)
    return config


def test_every_round_records_its_epsilon_and_the_summary_and_privacy_csv_say_the_same(tmp_path):
    result = fedge.run(private(tmp_path, 3, sigma=2.0))
    shape = Release(1, "update", "client", "gaussian", 2.0).shape()
    for t, row in enumerate(result.metrics, start=1):
        assert row["epsilon"] == pytest.approx(epsilon({shape: t}, 1e-5))
        assert row["epsilon_round"] == pytest.approx(epsilon({shape: 1}, 1e-5))
        assert row["epsilon_next"] == pytest.approx(epsilon({shape: t + 1}, 1e-5))
    assert result.summary["epsilon"] == result.metrics[-1]["epsilon"]
    assert result.summary["privacy"]["releases_by_kind"] == {"update": 3}
    with open(result.run_dir / "privacy.csv") as f:
        assert [row["round"] for row in csv.DictReader(f)] == ["1", "2", "3"]


def test_a_run_without_a_mechanism_has_no_epsilon(tmp_path):
    result = fedge.run(tiny("fedavg", tmp_path, 1))
    assert "epsilon" not in result.metrics[0] and result.summary["epsilon"] is None
    assert not (result.run_dir / "privacy.csv").exists()


def test_max_epsilon_stops_the_run_before_the_budget_is_crossed(tmp_path):
    shape = Release(1, "update", "client", "gaussian", 2.0).shape()
    budget = (epsilon({shape: 3}, 1e-5) + epsilon({shape: 4}, 1e-5)) / 2  # 3 rounds fit, 4 do not
    result = fedge.run(private(tmp_path, 10, sigma=2.0, max_epsilon=budget))
    assert result.summary["stopped_by"] == "max_epsilon" and result.summary["rounds"] == 3
    assert result.summary["epsilon"] <= budget and "accuracy" in result.metrics[-1]


def test_a_resumed_run_keeps_its_releases(tmp_path):
    whole = fedge.run(private(tmp_path / "whole", 3))
    config = private(tmp_path / "cut", 3)
    config["rounds"] = 2
    first = fedge.run(config)
    resumed = fedge.resume(first.run_dir, rounds=3)
    assert resumed.summary["epsilon"] == pytest.approx(whole.summary["epsilon"])
    assert resumed.summary["privacy"]["releases_by_kind"] == {"update": 3}


def test_a_target_epsilon_with_nothing_to_calibrate_is_refused(tmp_path):
    config = private(tmp_path, 2)
    config["privacy"] = {"target_epsilon": 2.0}
    with pytest.raises(ConfigError, match="privacy.target_epsilon"):
        fedge.run(config)


def test_the_ledger_state_round_trips():
    ledger = PrivacyLedger(2)
    ledger.record(Release(1, "label", "label", "randomized_response", 0.3, buckets=4, clients=(1,)))
    again = PrivacyLedger(2)
    again.load_state_dict(ledger.state_dict())
    assert again.releases == ledger.releases


def test_a_budget_the_first_round_already_exceeds_is_refused_before_the_run(tmp_path):
    config = tiny("splitfed_v2", tmp_path, 2)
    config["privacy"] = {"cut": {"clip": 1.0, "noise_multiplier": 0.5}}
    config["stop"] = {"max_epsilon": 0.01}
    with pytest.raises(ConfigError, match="stop.max_epsilon"):
        fedge.run(config)
    assert not any(tmp_path.iterdir())  # nothing written
