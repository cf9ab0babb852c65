"""fedge compare: several algorithms over seeds, one table, keys re-targeted per algorithm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cases import tiny
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


def _split_compare_args(tmp_path, *overrides: str) -> list[str]:
    config = tiny("splitfed_v2", tmp_path / "runs", rounds=1)
    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(config))
    return ["compare", str(path), *overrides, "-a", "splitfed_v2,cse_fsl", "-q", "--json"]


def test_an_algorithm_override_goes_only_to_the_algorithms_that_have_the_key(tmp_path):
    result = CliRunner().invoke(app, _split_compare_args(tmp_path, "algorithm.h=2", "rounds=2"))
    assert result.exit_code == 0, result.output
    out_dir = Path(json.loads(result.output)["out_dir"])
    configs = {
        name: yaml.safe_load((out_dir / f"{name}-s0" / "config.yaml").read_text())
        for name in ("splitfed_v2", "cse_fsl")
    }
    assert configs["cse_fsl"]["algorithm"]["upload_every"] == 2  # h is its short name
    assert "upload_every" not in configs["splitfed_v2"]["algorithm"]
    assert configs["splitfed_v2"]["rounds"] == configs["cse_fsl"]["rounds"] == 2
    saved = json.loads((out_dir / "comparison.json").read_text())
    assert saved["dropped_keys"] == {"splitfed_v2": ["h"]}


@pytest.mark.parametrize(
    ("override", "named"),
    [("algorithm.hh=2", "algorithm.hh"), ("algorithm.name=fedavg", "algorithm.name"), ("algorithm.h=0", "h")],
)
def test_a_bad_algorithm_override_is_refused_before_any_directory(tmp_path, override, named):
    result = CliRunner().invoke(app, _split_compare_args(tmp_path, override))
    assert result.exit_code == 2 and named in result.output
    assert not (tmp_path / "runs").exists()


def test_retarget_applies_an_override_the_algorithm_knows(tiny_config):
    config = fedge.resolve_config(tiny_config)
    target, dropped = retarget(config, "fedavg", ["algorithm.fraction=0.4", "algorithm.h=3"])
    assert target.algorithm.fraction == 0.4 and dropped == ["h"]
