"""examples/robust_tables.py: a grid's rows, columns, spreads and paired differences from sweep results,
and a tiny real sweep read back through it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cases import example_script

import fedge.experiments.sweep as sweeps

EXAMPLES = Path(__file__).parents[2] / "examples"


def _script():
    return example_script("robust_tables")


def _write(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    with (path / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_a_grid_pairs_each_defence_with_the_mean_seed_by_seed(tmp_path):
    script = _script()
    accuracy = {("mean", 1): 0.50, ("mean", 2): 0.60, ("median", 1): 0.70, ("median", 2): 0.82}
    attacked = [
        {"cell": f"{d}-s{s}", "label": f"{d}, attack=sign_flip", "seed": s, "adversary.attack": "sign_flip",
         "final_accuracy": a, "malicious_kept": 0.2 if d == "mean" else 0.05, "sim_seconds": 1.0}
        for (d, s), a in accuracy.items()
    ]  # fmt: skip
    clean = [
        {"cell": d, "label": d, "seed": s, "final_accuracy": 0.8, "malicious_kept": "", "sim_seconds": 2.0}
        for d in ("mean", "median")
        for s in (1, 2)
    ]
    _write(tmp_path / "attacked", attacked)
    _write(tmp_path / "clean", clean)
    grid = script.Grid("t", ("attacked",), ("clean",))
    text = "\n".join(script.section(tmp_path, grid))
    assert "| none | 80.00 ± 0.00 | 80.00 ± 0.00 |" in text
    assert "| sign_flip | 55.00 ± 7.07 | 76.00 ± 8.49 |" in text
    assert f"| sign_flip | {sweeps.paired_text([20.0, 22.0])} |" in text  # median - mean, paired
    assert "| sign_flip | 0.200 ± 0.000 | 0.050 ± 0.000 |" in text  # malicious_kept, equal on both seeds
    assert "| none | 2.000 ± 0.000 | 2.000 ± 0.000 |" in text  # the clean runs' simulated seconds


def test_a_sweep_without_results_leaves_its_grid_out(tmp_path):
    script = _script()
    assert script.section(tmp_path, script.GRIDS[0]) == []


def test_kept_csv_files_rebuild_the_same_tables(tmp_path, monkeypatch):
    script = _script()
    rows = [
        {"cell": "mean", "label": "mean", "seed": 1, "final_accuracy": 0.5, "sim_seconds": 1.0},
        {"cell": "krum", "label": "krum", "seed": 1, "final_accuracy": 0.4, "sim_seconds": 1.5},
    ]
    _write(tmp_path / "runs" / "robust-fedavg-backdoor", rows)
    monkeypatch.setattr(script, "KEPT", tmp_path / "kept")
    script.keep(tmp_path / "runs", script.GRIDS)
    assert (tmp_path / "kept" / "robust-fedavg-backdoor.csv").is_file()
    grid = script.GRIDS[1]
    assert script.section(tmp_path / "runs", grid) == script.section(tmp_path / "kept", grid)
    assert any("| backdoor | 50.00 | 40.00 |" in line for line in script.section(tmp_path / "kept", grid))


@pytest.mark.parametrize("sweep", sorted((EXAMPLES / "sweeps").glob("robust-*.yaml")), ids=lambda p: p.stem)
def test_every_robustness_sweep_expands_and_is_in_a_grid(sweep):
    script = _script()
    base, spec = sweeps.load_sweep(sweep, [], None, None, None, None)
    assert sweeps.expand(base, spec)
    assert any(spec.name in (*g.attacked, *g.clean) for g in script.GRIDS)
