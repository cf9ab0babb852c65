"""The backdoor in the split family: malicious split clients train on their stamped view (their smashed
data and labels reach the server part), ``attack_success`` is the composed model's (client part + server
part). The backdoor succeeds where the clean model has none, both executors agree, and attackers that
never start change no number."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import fedge

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import tiny  # noqa: E402

BACKDOOR = {"clients": [0, 4, 8], "attack": "backdoor", "options": {"target": 0}}


def _digits(tmp_path: Path, algorithm: str, adversary: dict[str, Any]) -> dict[str, Any]:
    return {
        "seed": 1,
        "rounds": 3,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 12},
        "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1},
        "algorithm": {"name": algorithm},
        "adversary": adversary,
        "output": {"dir": str(tmp_path), "plots": False},
    }


@pytest.mark.parametrize("algorithm", ["splitfed_v2", "cse_fsl", "fsl_an"])
def test_the_split_backdoor_succeeds_where_the_clean_model_does_not(tmp_path, algorithm):
    attacked = fedge.run(_digits(tmp_path, algorithm, BACKDOOR))
    clean = fedge.run(_digits(tmp_path, algorithm, {**BACKDOOR, "start_round": 99}))
    success = attacked.summary["final_attack_success"]
    assert success == attacked.metrics[-1]["attack_success"] > 0.6
    assert clean.summary["final_attack_success"] < 0.1


@pytest.mark.parametrize("algorithm", ["splitfed_v1", "cse_fsl", "fsl_sage"])
def test_both_executors_train_the_split_backdoor_alike(tmp_path, algorithm):
    runs = []
    for executor in ("sequential", "batched"):
        config = tiny(algorithm, tmp_path / executor)
        config["partition"]["num_clients"] = 8
        config["adversary"] = {"clients": [1, 6], "attack": "backdoor", "options": {"trigger_size": 2}}
        config["engine"] = {"executor": executor}
        runs.append(fedge.run(config).metrics[-1])
    assert runs[0]["attack_success"] == pytest.approx(runs[1]["attack_success"], abs=1e-6)
    assert runs[0]["accuracy"] == pytest.approx(runs[1]["accuracy"], abs=1e-6)


@pytest.mark.parametrize("algorithm", ["splitfed_v2", "cse_fsl", "fsl_sage"])
def test_split_attackers_that_never_start_change_no_number(tmp_path, algorithm):
    plain = fedge.run(tiny(algorithm, tmp_path / "plain"))
    config = tiny(algorithm, tmp_path / "late")
    config["adversary"] = {"clients": [1], "attack": "backdoor", "start_round": 9}
    late = fedge.run(config)
    drop = {"wall_seconds", "malicious", "malicious_kept", "attack_success"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in plain.metrics] == [
        {k: v for k, v in r.items() if k not in drop} for r in late.metrics
    ]
    assert all("attack_success" in r for r in late.metrics)
