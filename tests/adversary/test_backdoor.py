"""The backdoor (fedge.runtime.backdoor): the poisoned view stamps and relabels the malicious clients'
own copies, the attack success rate is exact on constructed models, a strong backdoor succeeds on
digits where the clean model does not, rounds before the attack are the clean run's, FedAvg-FT reports
it, and data it cannot stamp is refused naming the key (bad options: tests/adversary/test_attacks.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import fedge
from fedge.config import AdversaryConfig
from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.errors import ConfigError
from fedge.runtime.adversary import Adversary
from fedge.runtime.backdoor import Trigger, attack_success

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import tiny  # noqa: E402


def _toy(shape: tuple[int, ...] = (1, 4, 4)) -> FederatedData:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(12, *shape, generator=g), torch.arange(12) % 3
    dataset = Dataset("toy", x, y, x[:6].clone(), y[:6].clone(), num_classes=3)
    shards = [np.arange(0, 4), np.arange(4, 8), np.array([8, 9, 10, 11, 5])]  # client 2 shares sample 5
    return FederatedData(dataset, shards, [np.arange(6)] * 3, seed=0)


def _backdoor(data: FederatedData, bad: list[int], **options: Any) -> Adversary:
    config = AdversaryConfig(clients=bad, attack="backdoor", options=options)
    adversary = Adversary.of(config, data, 5, 1)
    assert adversary is not None and adversary.backdoor is not None
    return adversary


def test_the_view_stamps_and_relabels_the_malicious_clients_own_copies():
    data = _toy()
    adversary = _backdoor(data, [1], target=2, trigger_size=2, poison_fraction=0.5)
    view, top = adversary.data(1, data), float(data.x_train.max())
    own = view.client_train[1]
    new = own[own >= 12]
    assert len(new) == 2 and len(view.y_train) == 14  # round(0.5 * 4) copies appended
    assert view.y_train[new].tolist() == [2, 2]
    assert torch.all(view.x_train[new][..., -2:, -2:] == top)
    kept = own[own < 12]
    assert np.isin(kept, np.arange(4, 8)).all() and len(own) == 4
    source = np.setdiff1d(np.arange(4, 8), kept)  # the copies' originals, left clean for everyone
    assert torch.equal(view.x_train[new][..., :-2, :], data.x_train[source][..., :-2, :])
    assert torch.equal(view.x_train[:12], data.x_train) and torch.equal(view.y_train[:12], data.y_train)
    for c in (0, 2):  # honest clients, client 2 sharing sample 5, read the clean samples
        assert np.array_equal(view.client_train[c], data.client_train[c])
    assert torch.equal(
        adversary.data(1, data).x_train,
        _backdoor(data, [1], target=2, trigger_size=2, poison_fraction=0.5).data(1, data).x_train,
    )


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    model = nn.Sequential(nn.Flatten(), nn.Linear(weight.shape[1], weight.shape[0]))
    return model, {"1.weight": weight, "1.bias": bias}


def test_attack_success_is_exact_on_constructed_models():
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(11, 1, 3, 3, generator=g) - 0.5, torch.tensor([0, 1, 2, 1, 1, 0, 2, 2, 1, 0, 2])
    trigger = Trigger(1, 1.0)

    def rate(weight: torch.Tensor, bias: torch.Tensor) -> float:
        model, params = _linear(weight, bias)
        return attack_success(model, params, {}, x, y, trigger, 1, batch_size=3)

    zero = torch.zeros(3, 9)
    assert rate(zero, torch.tensor([0.0, 1.0, 0.0])) == 1.0  # always the target
    assert rate(zero, torch.tensor([1.0, 0.0, 0.0])) == 0.0  # never
    corner = zero.clone()
    corner[1, 8] = 1.0  # target logit = the bottom-right pixel: the trigger sets it to 1 > 0.5
    assert rate(corner, torch.tensor([0.5, 0.0, 0.0])) == 1.0
    first = zero.clone()
    first[1, 0] = 1.0  # target logit = the top-left pixel, which the trigger leaves: target iff it > 0
    others = y != 1
    want = float((x[others, 0, 0, 0] > 0).sum()) / int(others.sum())
    assert 0 < want < 1 and rate(first, torch.zeros(3)) == pytest.approx(want, abs=1e-12)
    assert (
        attack_success(*_linear(zero, torch.zeros(3)), {}, x, torch.ones(11, dtype=torch.long), trigger, 1, 3)
        == 0.0
    )


def _digits(tmp_path: Path, adversary: dict | None, rounds: int = 4) -> dict:
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": rounds,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": "fedavg", "optimizer": {"lr": 0.1}},
        "engine": {"threads": 1},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }
    if adversary is not None:
        config["adversary"] = adversary
    return config


def test_a_strong_backdoor_succeeds_where_the_clean_model_does_not(tmp_path):
    adversary = {"clients": [0, 1, 2], "attack": "backdoor", "options": {"target": 3}}
    attacked = fedge.run(_digits(tmp_path, adversary))
    assert attacked.summary["final_attack_success"] == attacked.metrics[-1]["attack_success"] > 0.8
    idle = fedge.run(_digits(tmp_path, {**adversary, "start_round": 99}))  # never attacks: the clean model
    assert idle.summary["malicious"] == 0 and idle.summary["final_attack_success"] < 0.2


def test_rounds_before_the_attack_are_the_clean_runs(tmp_path):
    config = tiny("fedavg", tmp_path / "runs", rounds=3)
    config["eval"] = {"every": 1}
    clean = fedge.run(config)
    assert (
        all("attack_success" not in m for m in clean.metrics) and "final_attack_success" not in clean.summary
    )
    config["adversary"] = {"clients": [1], "attack": "backdoor", "start_round": 3, "options": {"scale": 2.0}}
    attacked = fedge.run(config)
    for a, b in zip(clean.metrics[:2], attacked.metrics[:2], strict=True):
        assert (a["accuracy"], a["loss"], a["train_loss"]) == (b["accuracy"], b["loss"], b["train_loss"])
    assert [m["malicious"] for m in attacked.metrics] == [0, 0, 1]
    assert all("attack_success" in m for m in attacked.metrics)
    assert attacked.metrics[2]["accuracy"] != clean.metrics[2]["accuracy"]


def test_fedavg_ft_reports_the_global_models_attack_success(tmp_path):
    config = tiny("fedavg_ft", tmp_path / "runs", rounds=1)
    config["algorithm"].update(fraction=1.0, local_epochs=1)
    config["adversary"] = {"clients": [2], "attack": "backdoor", "options": {"trigger_size": 6}}
    result = fedge.run(config)
    assert 0 <= result.metrics[-1]["attack_success"] <= 1 and "global_accuracy" in result.metrics[-1]


def test_data_it_cannot_stamp_is_refused():
    with pytest.raises(ConfigError, match="^adversary.attack: backdoor stamps images"):
        _backdoor(_toy((16,)), [1])
    with pytest.raises(ConfigError, match="^adversary.options.target: 3 is not among the 3 classes"):
        _backdoor(_toy(), [1], target=3)
    with pytest.raises(ConfigError, match="^adversary.options.trigger_size: 5 is larger"):
        _backdoor(_toy(), [1], trigger_size=5)
