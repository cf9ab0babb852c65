"""examples/privacy_experiments.py: its smoke run writes calibrated rows and tables, a config fedge
refuses becomes a pending row, and OMA's equal-epsilon multiplier spends the epsilon it is given."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from cases import example_script

from fedge.privacy.accountant import epsilon
from fedge.privacy.release import GAUSSIAN, Release

EXAMPLES = Path(__file__).parents[2] / "examples"
FASHION = Path("/usr/share/datasets/fashion-mnist")


def _script():
    return example_script("privacy_experiments")


def test_equal_epsilon_multiplier_spends_the_given_epsilon():
    script = _script()
    low, high = (script.equal_epsilon_multiplier(eps, 40, 1e-5) for eps in (1.0, 4.0))
    assert low > high > 0
    spent = epsilon({Release(1, "edge", "client", GAUSSIAN, high).shape(): 40}, 1e-5)
    assert spent == pytest.approx(4.0, rel=1e-3)


def test_a_refused_config_is_a_pending_row_naming_the_key(tmp_path):
    script = _script()
    job = script.Job(
        "cut",
        "splitfed_v2-bad",
        1,
        EXAMPLES / "privacy-split.yaml",
        ["aggregation.stages=[{name: no_such_stage}]"],
        {"algorithm": "splitfed_v2", "target": None},
    )
    row = script.execute(job, tmp_path, fresh=False)
    assert row["status"] == "pending" and "aggregation.stages" in row["note"]
    assert not (tmp_path / "cut" / job.name).exists()


@pytest.mark.skipif(not FASHION.is_dir(), reason="Fashion-MNIST not installed (apt dataset-fashion-mnist)")
def test_quick_cut_grid_calibrates_pairs_and_reads_back(tmp_path):
    script = _script()
    script.main(["--quick", "--only", "cut", "--out", str(tmp_path)])
    with (tmp_path / "privacy_cut.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(r["variant"] for r in rows) == sorted(
        f"{a}-{t}" for a in ("splitfed_v2", "cse_fsl", "splitfed_v2_4rounds") for t in ("none", "eps2")
    )
    assert all(r["status"] == "done" for r in rows)
    for row in rows:
        if row["variant"].endswith("none"):
            assert row["epsilon"] == "" and row["noise_multiplier"] == ""
        else:  # calibrated to the target, met from below
            assert 1.9 < float(row["epsilon"]) <= 2.0 + 1e-6 and float(row["noise_multiplier"]) > 0
    kept = json.loads((tmp_path / "privacy_cut.json").read_text())
    assert {(p["first"], p["second"]) for p in kept["paired"]} >= {
        ("splitfed_v2-eps2", "splitfed_v2-none"),
        ("cse_fsl-eps2", "splitfed_v2-eps2"),
        ("cse_fsl-eps2", "splitfed_v2_4rounds-eps2"),
    }
    assert "| splitfed_v2-eps2 |" in (tmp_path / "privacy.md").read_text()
    summary = tmp_path / "cut" / "splitfed_v2-eps2-s1" / "summary.json"
    before = summary.stat().st_mtime_ns
    script.main(["--quick", "--only", "cut", "--out", str(tmp_path)])
    assert summary.stat().st_mtime_ns == before  # finished runs are read back, not rerun
