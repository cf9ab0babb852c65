"""Stop rules and time to target: where a run stops, what its summary says, per-round records."""

from __future__ import annotations

import pytest

import fedge
from fedge.config import StopConfig
from fedge.files import results
from fedge.runner import checkpoint, stop


def test_every_round_writes_a_record_and_only_evaluated_ones_carry_accuracy(tiny_config):
    tiny_config.update(rounds=5, eval={"every": 2})
    result = fedge.run(tiny_config)
    rows = results.read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert ["accuracy" in r for r in rows] == [False, True, False, True, True]
    for row in rows:
        assert {"train_loss", "mb_total", "sim_seconds", "bits_by_link", "storage_by_node"} <= set(row)
        assert sum(row["bits_by_link"]["up"].values()) == row["bits_up"]
    assert rows[0]["storage_by_node"]["server"] == rows[0]["storage_server_bits"]
    summary = result.summary
    assert summary["best_accuracy"] == max(r["accuracy"] for r in rows if "accuracy" in r)
    kinds = {(k["kind"], k["direction"]): k["bits"] for k in summary["ledger_kinds"]}
    assert kinds == {("model_down", "down"): summary["bits_down"], ("model_up", "up"): summary["bits_up"]}
    assert set(summary["peak_storage_bits"]) == {"server", *(f"client:{i}" for i in range(5))}
    environment = (result.run_dir / "environment.json").read_text()
    assert '"torch"' in environment and '"torch_threads"' in environment


def test_target_accuracy_stops_at_the_first_evaluated_round_at_or_above_it(tiny_config):
    reference = fedge.run(tiny_config, ["rounds=12"]).metrics
    target = sorted(r["accuracy"] for r in reference)[len(reference) // 2]
    first = next(r["round"] for r in reference if r["accuracy"] >= target)
    stopped = fedge.run(tiny_config, ["rounds=12", f"stop.target_accuracy={target}"])
    assert stopped.metrics[-1]["round"] == first < 12
    assert stopped.summary["stopped_by"] == "target_accuracy"
    reached = stopped.summary["time_to_target"][f"{target:g}"]
    assert reached["round"] == first and reached["mb_total"] == stopped.metrics[-1]["mb_total"]
    assert checkpoint.load(stopped.run_dir / "checkpoint.pt").header["round"] == first
    assert fedge.resume(stopped.run_dir).metrics[-1]["round"] == first  # a stopped run stays stopped


def test_budgets_stop_after_the_round_that_crosses_them_and_evaluate_it(tiny_config):
    per_round = fedge.run(tiny_config, ["rounds=1"]).summary["mb_total"]
    result = fedge.run(tiny_config, ["rounds=10", "eval.every=5", f"stop.max_mb={2.5 * per_round}"])
    assert result.metrics[-1]["round"] == 3 and "accuracy" in result.metrics[-1]
    assert result.summary["stopped_by"] == "max_mb"
    by_link = fedge.run(tiny_config, ["rounds=10", f"stop.max_mb={{up: {0.9 * per_round}}}"])
    assert by_link.metrics[-1]["round"] == 2 and by_link.summary["stopped_by"] == "max_mb"
    seconds = result.metrics[0]["sim_seconds"]
    timed = fedge.run(tiny_config, ["rounds=10", f"stop.max_sim_seconds={3.5 * seconds}"])
    assert timed.summary["stopped_by"] == "max_sim_seconds" and timed.metrics[-1]["round"] == 4


def test_patience_counts_evaluations_without_improvement():
    cfg = StopConfig(patience=2, min_delta=0.01)
    rows = [
        {"round": t, "accuracy": a, "mb_total": 0, "sim_seconds": 0}
        for t, a in enumerate([0.5, 0.6, 0.605, 0.6], 1)
    ]
    assert stop.check(cfg, rows[:3]) is None
    assert stop.check(cfg, rows) == stop.Stop("patience", 4)
    assert stop.first_reached(rows, 0.6)["round"] == 2 and stop.first_reached(rows, 0.9) is None


def test_stop_config_is_checked():
    with pytest.raises(fedge.ConfigError, match="stop.target_accuracy"):
        fedge.resolve_config(None, ["stop.target_accuracy=1.5"])
    with pytest.raises(fedge.ConfigError, match="stop.colour"):
        fedge.resolve_config(None, ["stop.colour=1"])
