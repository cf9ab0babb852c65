"""fedge compare: several algorithms over seeds, one table, keys re-targeted per algorithm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cases import tiny
from typer.testing import CliRunner

import fedge
from fedge.cli.commands import app
from fedge.errors import ConfigError
from fedge.experiments.compare import compare, retarget


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


def _compare_cli(tiny_config, tmp_path, *args: str):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    return CliRunner().invoke(app, ["compare", str(path), *args])


def test_every_run_is_checked_before_any_trains(tiny_config, tmp_path):
    """A split algorithm on a model without a default cut is refused before FedAvg trains for nothing."""
    result = _compare_cli(tiny_config, tmp_path, "-a", "fedavg,cse_fsl_async")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("error: model.cut: split learning needs a cut"), result.output
    assert lines[-1].endswith("(cse_fsl_async, seed 3)"), result.output
    assert "round" not in result.output and not (tmp_path / "runs").exists()


@pytest.mark.ci
def test_a_late_failure_keeps_the_table_of_the_finished_runs(tiny_config, tmp_path, monkeypatch):
    """The second algorithm's run diverges: the first one's row is printed and written, then the error."""
    from fedge.errors import Diverged
    from fedge.runner.loop import Runner

    finish = Runner.run

    def run_or_diverge(self):
        if self.config.algorithm.name == "centralized":
            raise Diverged(self.run_dir, 1, "loss nan", None)
        return finish(self)

    monkeypatch.setattr(Runner, "run", run_or_diverge)
    result = _compare_cli(tiny_config, tmp_path, "-a", "fedavg,centralized", "-q")
    assert result.exit_code == 3, result.output
    assert "fedge compare" in result.output and "fedavg" in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: ") and "centralized-s0: diverged in round 1" in last, result.output
    (out_dir,) = (tmp_path / "runs").glob("compare-*")
    saved = json.loads((out_dir / "comparison.json").read_text())
    assert [row["algorithm"] for row in saved["rows"]] == ["fedavg"]
    assert saved["failed"]["algorithm"] == "centralized" and "diverged" in saved["failed"]["error"]


@pytest.mark.ci
def test_compare_shows_each_runs_progress_as_run_does(tiny_config, tmp_path):
    result = _compare_cli(tiny_config, tmp_path, "-a", "fedavg,centralized", "--seeds", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("[1/4] fedavg seed 3") for line in lines), result.output
    assert any(line.startswith("[4/4] centralized seed 4") for line in lines), result.output
    assert any(line.startswith("fedavg s3  round 4/4  acc") for line in lines), result.output
