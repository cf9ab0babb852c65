"""fedge compare: several algorithms over seeds, one table, keys re-targeted per algorithm."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import fedge
from fedge.cli import app
from fedge.compare import compare, retarget
from fedge.errors import ConfigError


def test_retarget_keeps_known_keys_and_reports_the_rest(tiny_config):
    config = fedge.resolve_config(tiny_config, ["algorithm.fraction=0.4"])
    target, dropped = retarget(config, "centralized")
    assert target.algorithm.name == "centralized" and target.algorithm.batch_size == 16
    assert "fraction" in dropped and "batch_size" not in dropped
    with pytest.raises(ConfigError, match="unknown algorithm"):
        retarget(config, "nope")


def test_compare_tabulates_mean_and_std_over_seeds(tiny_config):
    outcome = compare(fedge.resolve_config(tiny_config), ["fedavg", "centralized"], seeds=2)
    assert [row["algorithm"] for row in outcome.rows] == ["fedavg", "centralized"]
    fedavg_runs = outcome.runs["fedavg"]
    assert [r.config.seed for r in fedavg_runs] == [3, 4]
    finals = [r.summary["final_accuracy"] for r in fedavg_runs]
    row = outcome.rows[0]
    assert row["final_accuracy_mean"] == pytest.approx(sum(finals) / 2)
    assert row["final_accuracy_std"] == pytest.approx(abs(finals[0] - finals[1]) / 2**0.5)
    assert row["communication_mb"] > 0 and outcome.rows[1]["communication_mb"] == 0
    saved = json.loads((outcome.out_dir / "comparison.json").read_text())
    assert saved["rows"] == outcome.rows
    assert (outcome.out_dir / "plots" / "accuracy_vs_mb.png").is_file()


def test_compare_cli_rejects_unknown_algorithm_without_a_directory(tmp_path):
    args = ["compare", f"output.dir={tmp_path / 'r'}", "--algorithms", "fedavg,nope"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "nope" in result.output
    assert not (tmp_path / "r").exists()
