"""The adversary block in lightweight FedSL and FedSL (fedge.algorithms.split.light_fedsl): model poisoning
of the clients' trunk average breaks the mean, not the median at the server; poisoned smashed data and
flipped labels hurt; both executors attack alike; a run whose malicious clients never attack is the honest
run; the backdoor is refused in one line naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fedge
from fedge.config import parse_config
from fedge.errors import ConfigError


def _digits(
    tmp_path: Path, algorithm: str, adversary: dict | None, stages: list | None = None, **knobs: Any
) -> Any:
    """``rounds`` (40) mini-batch rounds of ``algorithm`` on digits, 10 iid clients, an MLP cut after its
    first layer."""
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": knobs.pop("rounds", 40),
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1},
        "algorithm": {"name": algorithm, "optimizer": {"lr": 0.2}, **knobs.pop("block", {})},
        "aggregation": {"stages": stages or []},
        "engine": {"threads": 1, **knobs},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    if adversary is not None:
        config["adversary"] = adversary
    return fedge.run(config)


def _numbers(result: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "wall_seconds"} for m in result.metrics]


def test_sign_flip_on_the_trunks_breaks_fedsls_mean_not_the_median(tmp_path):
    adversary = {"clients": [0, 1], "attack": "sign_flip", "options": {"scale": 4.0}}
    clean = _digits(tmp_path, "fedsl", None).summary["final_accuracy"]
    mean = _digits(tmp_path, "fedsl", adversary)
    median = _digits(tmp_path, "fedsl", adversary, [{"name": "median", "at": ["server"]}])
    assert mean.summary["final_accuracy"] < clean - 0.3
    assert median.summary["final_accuracy"] > mean.summary["final_accuracy"] + 0.3
    assert mean.summary["malicious_kept"] == pytest.approx(0.2, abs=1e-6)  # uniform average of 10
    assert median.summary["malicious_kept"] < 0.15
    assert [m["malicious"] for m in mean.metrics] == [2] * 40


@pytest.mark.parametrize(
    ("attack", "options"), [("smashed_flip", {"scale": 10.0}), ("smashed_noise", {"sigma": 10.0})]
)
def test_poisoned_smashed_data_hurts_light_fedsl(tmp_path, attack, options):
    knobs = {"block": {"agg_interval": 2, "cut_dropout": 0.2}}
    clean = _digits(tmp_path, "light_fedsl", None, **knobs).summary["final_accuracy"]
    attacked = _digits(
        tmp_path, "light_fedsl", {"clients": [0, 1], "attack": attack, "options": options}, **knobs
    )
    assert attacked.summary["final_accuracy"] < clean - 0.2
    # plain rounds report how many attacked; aggregation rounds also what the mean kept of them
    assert [m["malicious"] for m in attacked.metrics] == [2] * 40
    assert "malicious_kept" not in attacked.metrics[0] and attacked.metrics[1][
        "malicious_kept"
    ] == pytest.approx(0.2)


def test_label_flip_hurts_fedsl(tmp_path):
    clean = _digits(tmp_path, "fedsl", None).summary["final_accuracy"]
    flipped = _digits(tmp_path, "fedsl", {"clients": [0, 1, 2, 3], "attack": "label_flip"})
    assert flipped.summary["final_accuracy"] < clean - 0.1


@pytest.mark.parametrize(
    ("algorithm", "attack"),
    [("light_fedsl", "smashed_noise"), ("fedsl", "alie"), ("light_fedsl", "label_flip")],
)
def test_both_executors_attack_alike_and_the_attack_acts(tmp_path, algorithm, attack):
    adversary = {"clients": [0, 3], "attack": attack}
    runs = [
        _digits(tmp_path, algorithm, adversary, rounds=4, executor=executor)
        for executor in ("sequential", "batched", "batched")
    ]
    honest = _digits(tmp_path, algorithm, None, rounds=4, executor="batched")
    for key in ("accuracy", "train_loss"):
        assert runs[0].metrics[-1][key] == pytest.approx(runs[1].metrics[-1][key], abs=1e-5)
    assert _numbers(runs[1]) == _numbers(runs[2])  # seeded: the same run twice
    assert _numbers(runs[1])[-1]["train_loss"] != honest.metrics[-1]["train_loss"]


@pytest.mark.parametrize("algorithm", ["light_fedsl", "fedsl"])
def test_a_run_whose_malicious_clients_never_attack_is_the_honest_run(tmp_path, algorithm):
    honest = _digits(tmp_path, algorithm, None, rounds=3)
    assert "malicious" not in honest.metrics[-1]
    for attack in ("smashed_noise", "sign_flip", "label_flip"):
        late = {"clients": [1, 2], "attack": attack, "start_round": 4}  # the run has three rounds
        result = _digits(tmp_path, algorithm, late, rounds=3)
        plain = [
            {k: v for k, v in m.items() if k not in ("malicious", "malicious_kept")} for m in _numbers(result)
        ]
        assert plain == _numbers(honest)
        assert result.summary["malicious"] == 0


@pytest.mark.parametrize("algorithm", ["light_fedsl", "fedsl"])
def test_the_backdoor_is_refused_naming_the_key(algorithm):
    config = {"algorithm": {"name": algorithm}, "adversary": {"clients": 0.5, "attack": "backdoor"}}
    with pytest.raises(ConfigError) as error:
        parse_config({"partition": {"num_clients": 4}, **config})
    assert error.value.key == "adversary.attack" and "\n" not in str(error.value)
    assert "stamped copies" in str(error.value)
