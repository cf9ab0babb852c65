"""The backdoor at the peer selectors (AFIND+, PENS, FedeRiCo): malicious peers train on their stamped
view and answer probes from their clean samples (``probes: honest``) or from that view (``poisoned``);
``attack_success`` is the honest peers' mean. Probe-honest poisoners plant the backdoor at AFIND+ and
FedeRiCo where the clean run has none, AFIND+ sees the probe-poisoning one, both executors agree and
attackers that never start change no number."""

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
        "rounds": 4,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 12},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": algorithm, "optimizer": {"lr": 0.1}},
        "adversary": adversary,
        "output": {"dir": str(tmp_path), "plots": False},
    }


@pytest.mark.parametrize("algorithm", ["afind", "federico"])
def test_probe_honest_poisoners_plant_the_backdoor(tmp_path, algorithm):
    attacked = fedge.run(_digits(tmp_path, algorithm, BACKDOOR))
    clean = fedge.run(_digits(tmp_path, algorithm, {**BACKDOOR, "start_round": 99}))
    success = attacked.summary["final_attack_success"]
    assert success == attacked.metrics[-1]["attack_success"] > 0.15
    assert clean.summary["final_attack_success"] < 0.05
    assert attacked.summary["malicious_selected"] > 0.15


def test_afind_sees_the_poisoner_that_probes_on_its_stamped_view(tmp_path):
    honest = fedge.run(_digits(tmp_path, "afind", BACKDOOR)).summary
    poisoned = fedge.run(_digits(tmp_path, "afind", {**BACKDOOR, "probes": "poisoned"})).summary
    assert poisoned["malicious_selected"] < honest["malicious_selected"] - 0.1
    assert poisoned["final_attack_success"] < honest["final_attack_success"] - 0.1


@pytest.mark.parametrize("probes", ["honest", "poisoned"])
@pytest.mark.parametrize("algorithm", ["afind", "pens", "federico"])
def test_both_executors_train_and_probe_the_backdoor_alike(tmp_path, algorithm, probes):
    runs = []
    for executor in ("sequential", "batched"):
        config = tiny(algorithm, tmp_path / executor)
        config["partition"]["num_clients"] = 8
        config["adversary"] = {"clients": [1, 6], "attack": "backdoor", "options": {"trigger_size": 2}}
        config["adversary"]["probes"] = probes
        config["engine"] = {"executor": executor}
        runs.append(fedge.run(config).metrics)
    assert all("attack_success" in r for r in runs[0])
    for key in ("attack_success", "accuracy", "malicious_selected"):
        assert runs[0][-1][key] == pytest.approx(runs[1][-1][key], abs=1e-6)


@pytest.mark.parametrize("algorithm", ["afind", "pens", "federico"])
def test_attackers_that_never_start_change_no_number(tmp_path, algorithm):
    plain = fedge.run(tiny(algorithm, tmp_path / "plain", rounds=3))
    config = tiny(algorithm, tmp_path / "late", rounds=3)
    config["adversary"] = {"clients": [1], "attack": "backdoor", "start_round": 9, "probes": "poisoned"}
    late = fedge.run(config)
    drop = {"wall_seconds", "malicious", "malicious_kept", "malicious_selected", "attack_success"}
    drop |= {"accuracy", "accuracy_std", "accuracy_min", "loss", "accuracy_all"}  # the honest peers'
    assert [r["accuracy"] for r in plain.metrics] == [r["accuracy_all"] for r in late.metrics]
    assert [{k: v for k, v in r.items() if k not in drop} for r in plain.metrics] == [
        {k: v for k, v in r.items() if k not in drop} for r in late.metrics
    ]
    assert all("attack_success" in r for r in late.metrics)
