"""The backdoor beyond the star server: a hierarchy's malicious members (HFedAvg, HIST), decentralized
malicious peers (gossip; ``attack_success`` the honest peers' mean) and an asynchronous server's clients
(FedBuff) plant it where the clean model has none, a median at the edge cuts it, both executors agree,
attackers that never start change no number, and the families it is not built for are refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import fedge
from fedge.config import parse_config
from fedge.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import tiny  # noqa: E402

BACKDOOR = {"clients": [0, 4, 8], "attack": "backdoor", "options": {"target": 0}}


def _digits(tmp_path: Path, algorithm: str, adversary: dict[str, Any], stages: list[Any] | None = None,
            rounds: int = 4) -> dict[str, Any]:  # fmt: skip
    block: dict[str, Any] = {"name": algorithm, "optimizer": {"lr": 0.1}}
    if algorithm in ("hfedavg", "hist"):
        block.update(cells=3, split="partition", edge_rounds=2, local_steps=5, batch_size=16)
    return {
        "seed": 1,
        "rounds": rounds,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 12},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": block,
        "aggregation": {"stages": stages or []},
        "adversary": adversary,
        "output": {"dir": str(tmp_path), "plots": False},
    }


@pytest.mark.parametrize("algorithm", ["hfedavg", "gossip", "fedbuff"])
def test_the_backdoor_succeeds_where_the_clean_model_does_not(tmp_path, algorithm):
    attacked = fedge.run(_digits(tmp_path, algorithm, BACKDOOR))
    clean = fedge.run(_digits(tmp_path, algorithm, {**BACKDOOR, "start_round": 99}))
    success = attacked.summary["final_attack_success"]
    assert success == attacked.metrics[-1]["attack_success"] > (0.3 if algorithm == "gossip" else 0.6)
    assert clean.summary["final_attack_success"] < 0.1


def test_a_median_at_the_edge_cuts_the_hierarchys_backdoor(tmp_path):
    mean = fedge.run(_digits(tmp_path, "hfedavg", BACKDOOR)).summary
    median = fedge.run(_digits(tmp_path, "hfedavg", BACKDOOR, [{"name": "median", "at": ["edge"]}])).summary
    assert median["final_attack_success"] < mean["final_attack_success"] - 0.4
    assert median["final_accuracy"] > 0.75


@pytest.mark.ci
def test_hists_members_plant_it_too(tmp_path):
    attacked = fedge.run(_digits(tmp_path, "hist", BACKDOOR, rounds=5)).summary
    assert attacked["final_attack_success"] > 0.6


@pytest.mark.parametrize("algorithm", ["hist", "gossip"])
def test_both_executors_train_the_backdoor_alike(tmp_path, algorithm):
    runs = []
    for executor in ("sequential", "batched"):
        config = tiny(algorithm, tmp_path / executor)
        config["partition"]["num_clients"] = 8
        if algorithm == "hist":
            config["algorithm"].update(cells=2, edge_rounds=2)
        config["adversary"] = {"clients": [1, 6], "attack": "backdoor", "options": {"trigger_size": 2}}
        config["engine"] = {"executor": executor}
        runs.append(fedge.run(config).metrics[-1])
    assert runs[0]["attack_success"] == pytest.approx(runs[1]["attack_success"], abs=1e-6)
    assert runs[0]["accuracy"] == pytest.approx(runs[1]["accuracy"], abs=1e-6)


@pytest.mark.parametrize("algorithm", ["hfedavg", "gossip", "fedbuff"])
def test_attackers_that_never_start_change_no_number(tmp_path, algorithm):
    config = tiny(algorithm, tmp_path / "plain")
    if algorithm == "hfedavg":
        config["algorithm"]["cells"] = 2
    plain = fedge.run(config)
    config = {**tiny(algorithm, tmp_path / "late"), "algorithm": config["algorithm"]}
    config["adversary"] = {"clients": [1], "attack": "backdoor", "start_round": 9}
    late = fedge.run(config)
    drop = {"wall_seconds", "malicious", "malicious_kept", "malicious_selected", "attack_success"}
    if algorithm == "gossip":  # under an adversary a peer run's evaluation is the honest peers'
        drop |= {"accuracy", "accuracy_std", "accuracy_min", "loss", "accuracy_all"}
        assert [r["accuracy"] for r in plain.metrics] == [r["accuracy_all"] for r in late.metrics]
    assert [{k: v for k, v in r.items() if k not in drop} for r in plain.metrics] == [
        {k: v for k, v in r.items() if k not in drop} for r in late.metrics
    ]
    assert all("attack_success" in r for r in late.metrics)


@pytest.mark.parametrize("algorithm", ["centralized"])
def test_the_families_it_is_not_built_for_are_refused(algorithm):
    with pytest.raises(ConfigError) as error:
        parse_config({"algorithm": {"name": algorithm}, "adversary": {"clients": [0], "attack": "backdoor"}})
    assert error.value.key in ("adversary.attack", "adversary")
