"""`fedge plot`, `compare` and `report` take the same things (a run, several, a sweep directory, a glob);
figures are in MB (2^20 bytes) everywhere; one seed shows no spread; `fedge bounds` takes example:NAME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedge.cli.commands import app
from fedge.errors import FedgeError
from fedge.experiments.sweep import cell_table, load_sweep, plan, run_sweep, table_markdown
from fedge.report.rundirs import find_run_dirs, names_runs

runner = CliRunner()


@pytest.fixture
def sweep_dir(tiny_config, tmp_path) -> Path:
    """A finished sweep: two learning rates times seeds 1 and 2, two rounds each."""
    tiny_config.update(rounds=2)
    path = tmp_path / "base.json"
    path.write_text(json.dumps(tiny_config))
    outcome = run_sweep(*load_sweep(str(path), grid=["algorithm.optimizer.lr=0.1,0.3"], seeds=[1, 2]))
    return outcome.sweep_dir


def _ok(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_run_dirs_from_a_sweep_a_glob_and_runs(sweep_dir):
    runs = sorted((sweep_dir / "runs").iterdir())
    assert find_run_dirs([sweep_dir]) == runs
    assert find_run_dirs([str(sweep_dir / "runs" / "*-s1")]) == [r for r in runs if r.name.endswith("-s1")]
    assert find_run_dirs([runs[0], runs[0], runs[1]]) == runs[:2]
    assert names_runs([str(sweep_dir)]) and not names_runs(["base.yaml", "rounds=2"])
    with pytest.raises(FedgeError, match="matches no directory"):
        find_run_dirs([str(sweep_dir / "nothing-*")])
    assert find_run_dirs([str(sweep_dir / "*")]) == runs  # index.csv, sweep.yaml... passed over
    (sweep_dir / "empty").mkdir()
    with pytest.raises(FedgeError, match="no run directories"):
        find_run_dirs([sweep_dir / "empty"])


@pytest.mark.ci
def test_plot_takes_a_sweep_directory_and_a_glob(sweep_dir, tmp_path):
    _ok("plot", str(sweep_dir))
    assert (sweep_dir / "plots" / "accuracy_vs_mb.png").is_file()
    _ok("plot", str(sweep_dir / "runs" / "*"), "--out", str(tmp_path / "globbed"))
    assert (tmp_path / "globbed" / "accuracy_vs_round.png").is_file()


def test_compare_takes_a_sweep_directory_and_a_glob(sweep_dir):
    rows = json.loads(_ok("compare", str(sweep_dir), "--json").output)["rows"]
    assert [row["seeds"] for row in rows] == [2, 2]
    globbed = json.loads(_ok("compare", str(sweep_dir / "runs" / "*-s1"), "--json").output)["rows"]
    assert [row["seeds"] for row in globbed] == [1, 1]


@pytest.mark.ci
def test_report_takes_several_runs_and_a_glob(sweep_dir, tmp_path):
    runs = sorted((sweep_dir / "runs").iterdir())
    _ok("report", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "two.html"))
    assert "2 run(s)" in (tmp_path / "two.html").read_text()
    _ok("report", str(sweep_dir / "runs" / "*"), "--out", str(tmp_path / "all.html"))
    assert "4 run(s) in 2 cell(s)" in (tmp_path / "all.html").read_text()
    _ok("report", str(sweep_dir))
    assert (sweep_dir / "report.html").is_file()


def test_compare_speaks_mb_and_shows_no_spread_for_one_seed(sweep_dir):
    table = _ok("compare", str(sweep_dir / "runs" / "*-s1")).output
    assert "MB, all links" in table and "server MB" in table
    assert "GiB" not in table and "server M " not in table and "± 0.00" not in table
    rows = json.loads(_ok("compare", str(sweep_dir / "runs" / "*-s1"), "--json").output)["rows"]
    assert "communication_mb" in rows[0] and not any(key.endswith("_gib") for key in rows[0])
    assert "± " in _ok("compare", str(sweep_dir)).output  # two seeds: a spread


def test_a_one_seed_sweep_table_shows_no_spread(sweep_dir):
    _, tasks = plan(*load_sweep(str(sweep_dir)))
    one = [task for task in tasks if task.seed == 1]
    summaries = {t.run_dir: json.loads((t.run_dir / "summary.json").read_text()) for t in one}
    text = table_markdown(cell_table(one, summaries, [0.5]), [0.5])
    assert " ± " not in text and "[±" not in text
    assert " ± " in table_markdown(cell_table(tasks, summaries | _all(tasks), []), [])


def _all(tasks) -> dict:
    return {t.run_dir: json.loads((t.run_dir / "summary.json").read_text()) for t in tasks}


def test_bounds_takes_a_shipped_example():
    result = _ok("bounds", "example:theory/cse-fsl", "--json")
    assert json.loads(result.output)[0]["bounds"]
    missing = runner.invoke(app, ["bounds", "example:theory/nope"])
    assert missing.exit_code == 2 and "theory/cse-fsl" in missing.output
