"""fedge sweep: cells from a grid, seed lists, results over seeds, and a killed sweep that continues."""

from __future__ import annotations

import csv
import os
import pickle
import signal
import sys
import time
from pathlib import Path

import children
import pytest
import yaml
from typer.testing import CliRunner

import fedge
from fedge.cli.commands import app
from fedge.errors import CheckpointError, ConfigError, DataError, Diverged, FedgeError, PathError
from fedge.experiments.sweep import SweepSpec, expand, finished_runs, load_sweep, plan, run_sweep


def test_grid_cells_keep_only_keys_their_algorithm_knows(tiny_config):
    spec = SweepSpec(grid={"algorithm.name": ["fedavg", "centralized"], "algorithm.fraction": [0.5, 1.0]})
    cells = expand(tiny_config, spec)
    assert [c.label for c in cells] == ["fedavg, fraction=0.5", "fedavg, fraction=1.0", "centralized"]
    assert cells[2].dropped == ["algorithm.fraction"] and "fraction" not in cells[2].raw["algorithm"]
    assert [c.slug for c in cells] == ["fedavg-fraction0.5", "fedavg-fraction1.0", "centralized"]


def test_sweep_file_merges_into_its_base_and_a_dotted_key_replaces(tiny_config, tmp_path):
    """As docs/usage.md says: a nested mapping in the sweep file merges into the base's, so an empty one
    changes nothing; a cell's dotted key replaces the mapping whole."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config))
    sweep = {"sweep": {"base": "base.yaml", "cells": {"kept": {}, "bare": {"model.options": {}}}}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({**sweep, "model": {"options": {}}}))
    base, spec = load_sweep(tmp_path / "sweep.yaml")
    options = {cell.slug: cell.raw["model"]["options"] for cell in expand(base, spec)}
    assert options == {"kept": {"hidden": [16]}, "bare": {}}


@pytest.mark.ci
def test_sweep_tabulates_mean_std_and_interval_over_seeds(tiny_config, tmp_path):
    path = tmp_path / "sweep.yaml"
    tiny_config["sweep"] = {"grid": {"algorithm.fraction": [0.6, 1.0]}, "seeds": [5, 6], "name": "s"}
    tiny_config["stop"] = {"targets": [0.4]}
    path.write_text(yaml.safe_dump(tiny_config))
    base, spec = load_sweep(path, ["rounds=3"], seeds=[5, 6, 7])
    outcome = run_sweep(base, spec)
    assert outcome.sweep_dir == tmp_path / "runs" / "s"
    assert [(r["cell"], r["seed"]) for r in outcome.rows] == [
        (cell, seed) for cell in ("fraction0.6", "fraction1.0") for seed in (5, 6, 7)
    ]
    finals = [float(r["final_accuracy"]) for r in outcome.rows[:3]]
    first = outcome.table[0]
    assert first["seeds"] == 3 and first["final_accuracy_mean"] == pytest.approx(sum(finals) / 3)
    assert first["final_accuracy_ci95"] == pytest.approx(
        4.302653 * first["final_accuracy_std"] / 3**0.5, rel=1e-5
    )
    assert "rounds_to_0.4" in outcome.rows[0] and (outcome.sweep_dir / "table.md").is_file()
    printed = CliRunner().invoke(app, ["sweep", str(path), "rounds=3", "--seeds", "5,6,7"])
    assert printed.exit_code == 0 and "[6/6]" not in printed.output  # everything done: nothing reruns
    assert "fraction=0.6" in printed.output and "± 95 % interval" in printed.output
    assert run_sweep(base, spec).rows == outcome.rows
    with pytest.raises(FedgeError, match="different sweep"):
        run_sweep(base, spec.model_copy(update={"seeds": [1]}))


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("model.options.hidden", "unknown option for cnn2"),
        PathError("/runs/a", "not writable"),
        CheckpointError("/runs/a/checkpoint.pt", "damaged"),
        DataError("/data/x: missing"),
        Diverged(Path("/runs/a"), 3, "loss is nan", 2),
    ],
)
def test_errors_survive_the_trip_from_a_worker_process(error):
    """A sweep's worker hands its error to the parent pickled: it arrives as itself, with its line."""
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and vars(again) == vars(error)


def test_sweep_refuses_an_unknown_model_option_before_any_run(tiny_config, tmp_path):
    """Model options are the builder's: a misspelt one is refused with its key and cell while planning,
    not by a worker half-way through the sweep."""
    path = tmp_path / "sweep.yaml"
    tiny_config["sweep"] = {"grid": {"algorithm.fraction": [0.6, 1.0]}, "name": "s"}
    tiny_config["model"]["options"] = {"bogus": 1}
    path.write_text(yaml.safe_dump(tiny_config))
    refused = r"model.options.bogus: unknown option for mlp.*\(cell fraction=0.6\)"
    with pytest.raises(ConfigError, match=refused):
        run_sweep(*load_sweep(path))
    assert not (tmp_path / "runs" / "s" / "runs").exists()


@pytest.mark.slow
def test_a_worker_error_reaches_the_sweep_as_itself(tiny_config, tmp_path):
    """A run that diverges in one of two worker processes stops the sweep with its own error (the
    parent unpickles it), not a broken process pool."""
    path = tmp_path / "sweep.yaml"
    tiny_config["algorithm"]["optimizer"]["lr"] = 1e30
    tiny_config["sweep"] = {"grid": {"algorithm.fraction": [0.6, 1.0]}, "jobs": 2}
    path.write_text(yaml.safe_dump(tiny_config))
    with pytest.raises(Diverged, match="diverged in round 1"):
        run_sweep(*load_sweep(path))


@pytest.mark.ci
@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_killed_sweep_continues_to_the_same_results(tiny_config, tmp_path, jobs):
    """A sweep (in one process, or two worker processes: slow) is SIGKILLed mid-run; the same sweep then
    finishes it, and its results.csv equals an uninterrupted sweep's (and no worker outlives the kill)."""
    tiny_config.update(rounds=12, engine={"threads": 1})  # small models run fastest on one thread
    tiny_config["output"]["checkpoint_every"] = 3
    tiny_config["sweep"] = {
        "grid": {"algorithm.fraction": [0.6, 1.0]},
        "seeds": [1, 2],
        "jobs": jobs,
        "name": "killed",
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    env = {**os.environ, "PYTHONPATH": str(Path(fedge.__file__).parents[1])}
    with children.started([sys.executable, "-m", "fedge", "sweep", str(path), "-q"], env=env) as proc:
        sweep_dir = tmp_path / "runs" / "killed"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            rows = [len(p.read_text().splitlines()) for p in sweep_dir.glob("runs/*/metrics.jsonl")]
            if len(rows) >= jobs and max(rows) >= 4:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=children.REAP)
        with (sweep_dir / "index.csv").open() as handle:
            states = [row["state"] for row in csv.DictReader(handle)]
        assert "interrupted" in states or "pending" in states, "the sweep finished before it could be killed"
        time.sleep(0.3)
        frozen = {p: p.stat().st_mtime for p in sweep_dir.glob("runs/*/metrics.jsonl")}
        time.sleep(0.5)
        assert frozen == {p: p.stat().st_mtime for p in sweep_dir.glob("runs/*/metrics.jsonl")}, (
            "workers outlived it"
        )
    continued = run_sweep(*load_sweep(path, jobs=1))  # the same sweep: skips, resumes, runs the rest
    assert continued.sweep_dir == sweep_dir and len(continued.rows) == 4
    reference = run_sweep(*load_sweep(path, name="uninterrupted", jobs=1))
    assert (sweep_dir / "results.csv").read_text() == (reference.sweep_dir / "results.csv").read_text()


@pytest.mark.parametrize("name", ["split-mnist", "split-h", "link-codecs"])
def test_example_sweeps_validate_every_cell(name):
    base, spec = load_sweep(f"example:sweeps/{name}")
    sweep_dir, tasks = plan(base, spec)
    assert len(tasks) == {"split-mnist": 18, "split-h": 12, "link-codecs": 18}[name]
    assert sweep_dir.name == spec.name


def test_finished_runs_keeps_only_runs_whose_summary_says_finished(tmp_path):
    rows = [("a", "runs/a", "finished"), ("b", "runs/b", "diverged"), ("c", "runs/c", None)]
    with (tmp_path / "index.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["cell", "seed", "run"])
        for cell, run, status in rows:
            writer.writerow([cell, 1, run])
            (tmp_path / run).mkdir(parents=True)
            if status is not None:
                (tmp_path / run / "summary.json").write_text(f'{{"status": "{status}"}}')
    assert [(run.entry["cell"], run.path, run.summary) for run in finished_runs(tmp_path)] == [
        ("a", tmp_path / "runs/a", {"status": "finished"})
    ]
    with pytest.raises(FedgeError, match="not a sweep directory"):
        finished_runs(tmp_path / "runs")
