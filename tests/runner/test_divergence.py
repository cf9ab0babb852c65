"""Divergence: a NaN or infinite loss, metric or parameter stops the run with one line naming the round and
the value, exit code 3, the last good checkpoint kept and a valid summary.json giving the reason; with
``stop.on_nonfinite: continue`` the run goes on and its files stay valid JSON."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from cases import check_outcome, invoke, strict_json, tiny

import fedge
from fedge.algorithms.fedavg import FedAvg
from fedge.errors import EXIT_DIVERGED, Diverged
from fedge.files import results
from fedge.metrics import RoundReport
from fedge.runner import checkpoint

WALL = ("wall_seconds",)


def strip_wall(rows):
    return [{k: v for k, v in row.items() if k not in WALL} for row in rows]


def test_a_diverging_step_size_stops_with_exit_3_and_a_valid_summary(tmp_path):
    out = tmp_path / "runs"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny("fedavg", out, rounds=3)))
    outcome = invoke(["run", str(path), "algorithm.optimizer.lr=1e30", "-q"])
    assert outcome.code == EXIT_DIVERGED == 3
    assert check_outcome(outcome, out) == "diverged"
    line = outcome.lines[0]
    assert "diverged in round 1: " in line and "= nan" in line and "no checkpoint yet" in line, line
    (run_dir,) = out.iterdir()
    summary = strict_json(run_dir / "summary.json")
    assert summary["reason"].startswith("round 1: ") and summary["last_checkpoint_round"] is None
    assert not (run_dir / "checkpoint.pt").exists()


@pytest.fixture
def poisoned(monkeypatch):
    """FedAvg whose round 3 reports a NaN training loss, or (``what='param'``) leaves an infinite weight."""
    original = FedAvg.run_round
    spoil = {"what": "loss"}

    def run_round(self, t):
        metrics = original(self, t)
        if t == 3 and spoil["what"] == "loss":
            metrics = RoundReport(math.nan, metrics.extra)
        if t == 3 and spoil["what"] == "param":
            next(iter(self.params.values())).view(-1)[5] = math.inf
        return metrics

    monkeypatch.setattr(FedAvg, "run_round", run_round)
    return spoil


def test_the_last_good_checkpoint_is_kept_and_resumes(tmp_path, poisoned, monkeypatch):
    config = tiny("fedavg", tmp_path / "runs", rounds=5)
    with pytest.raises(Diverged) as info:
        fedge.run(config)
    error = info.value
    assert (error.round, error.checkpoint_round) == (3, 2) and error.what == "train_loss = nan"
    assert "diverged in round 3: train_loss = nan (checkpoint of round 2 kept" in str(error)
    run_dir = error.run_dir
    assert checkpoint.load(run_dir / "checkpoint.pt").header["round"] == 2
    assert [row["round"] for row in results.read_jsonl(run_dir / "metrics.jsonl")] == [1, 2]
    summary = strict_json(run_dir / "summary.json")
    assert summary["status"] == "diverged" and summary["reason"] == "round 3: train_loss = nan"
    assert summary["last_checkpoint_round"] == 2 and summary["rounds"] == 2
    monkeypatch.undo()  # the cause is gone: the kept checkpoint resumes to the uninterrupted result
    resumed = fedge.resume(run_dir)
    reference = fedge.run(tiny("fedavg", tmp_path / "reference", rounds=5))
    assert strip_wall(resumed.metrics) == strip_wall(reference.metrics)
    assert strict_json(run_dir / "summary.json")["status"] == "finished"


def test_a_non_finite_parameter_is_caught_even_when_the_metrics_look_fine(tmp_path, poisoned):
    poisoned["what"] = "param"
    config = tiny("fedavg", tmp_path / "runs", rounds=4)
    config["eval"] = {"every": 10}  # no evaluation in round 3: only the state shows it
    with pytest.raises(Diverged) as info:
        fedge.run(config)
    assert info.value.round == 3 and info.value.what == "state.params.fc1.linear.weight holds inf"


def test_continue_runs_on_and_writes_valid_json(tmp_path):
    out = tmp_path / "runs"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny("fedavg", out, rounds=2)))
    outcome = invoke(["run", str(path), "algorithm.optimizer.lr=1e30", "stop.on_nonfinite=continue", "-q"])
    assert outcome.code == 0, outcome.output
    (run_dir,) = out.iterdir()
    summary = strict_json(run_dir / "summary.json")
    assert summary["status"] == "finished" and summary["first_nonfinite"].startswith("round 1: ")
    assert summary["final_loss"] is None  # NaN is written as null
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda token: pytest.fail(f"{token} in metrics.jsonl"))
    assert checkpoint.load(run_dir / "checkpoint.pt").state["nonfinite"] == summary["first_nonfinite"]
