"""examples/leakage_experiments.py: its smoke run writes rows, csv and the page; its jobs name what they
attack."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from cases import example_script

FASHION = Path("/usr/share/datasets/fashion-mnist")


def test_every_experiment_records_what_its_attacks_need() -> None:
    script = example_script("leakage_experiments")
    for name, jobs in script.EXPERIMENTS.items():
        for job in jobs([1]):
            record = next((key for key in job.overrides if key.startswith("output.record=")), "")
            if "label_direction" in job.attacks:
                assert "cut_gradients" in record, (name, job.variant)
            if "decoder" in job.attacks:
                assert "smashed" in record or job.config.name == "leakage-split.yaml", (name, job.variant)


@pytest.mark.ci  # runs and attacks on Fashion-MNIST: seconds
@pytest.mark.skipif(not FASHION.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_the_smoke_run_writes_its_table(tmp_path: Path) -> None:
    script = example_script("leakage_experiments")
    script.main(["--quick", "--only", "labels", "--out", str(tmp_path / "runs"), "--results", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "leakage" / "labels.csv").open()))
    assert len(rows) == 7  # 5 label epsilons, 2 cut-gradient noises
    assert all(0.0 <= float(row["label_auc"]) <= 1.0 for row in rows)
    assert "## labels" in (tmp_path / "leakage.md").read_text()
