"""The report's leakage section: the attacks `fedge attack` ran, with their image grids."""

from __future__ import annotations

from pathlib import Path

import fedge
from fedge.attacks.from_run import Budget, attack
from fedge.report.page import render


def test_an_attacked_run_shows_what_leaks_and_an_unattacked_one_does_not(tmp_path: Path) -> None:
    config = {
        "seed": 0,
        "rounds": 1,
        "data": {"name": "digits", "train_limit": 200},
        "partition": {"kind": "iid", "num_clients": 2},
        "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1},
        "algorithm": {"name": "splitfed_v2", "batch_size": 16},
        "output": {"dir": str(tmp_path), "plots": False, "record": ["smashed", "cut_gradients"]},
    }
    run_dir = fedge.run(config).run_dir
    assert "What leaks" not in render(run_dir)
    attack(run_dir, ["decoder", "label_direction"], budget=Budget(aux_samples=200, decoder_epochs=2))
    page = render(run_dir)
    assert "What leaks" in page and "label_direction" in page and "decoder" in page
    assert "data:image/png;base64," in page.split("What leaks", 1)[1]  # the decoder's grid, embedded
