"""The adversary block in split learning (fedge.runtime.split_adversary): poisoned smashed data equals the
hand computation and breaks CSE-FSL's server model, model poisoning of the client-model average is undone
by the median, label_flip changes the labels the server and the aux head see, both executors attack
alike, a run whose malicious clients never attack is the honest run, a deployment takes the adversary,
and bad configs are refused in one line naming the key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedge
from fedge.algorithms.split.clients import AuxHeadClients
from fedge.algorithms.split.server import SharedServer
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.rng import torch_rng
from fedge.runtime.split_adversary import smashed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import tiny  # noqa: E402

Z = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4) / 7 - 1
COUNTS = torch.tensor([3, 2])  # row 1's last entry is padding
BAD = np.array([False, True])
SERVE, STEP = SharedServer.serve, AuxHeadClients.step  # before any test patches them


def test_smashed_flip_and_noise_equal_the_hand_computation():
    flipped = smashed("smashed_flip", {"scale": 2.5}, Z, COUNTS, BAD)
    assert torch.equal(flipped[0], Z[0]) and torch.equal(flipped[1, 2], Z[1, 2])  # honest row, padding
    assert torch.allclose(flipped[1, :2], -2.5 * Z[1, :2])
    noise = smashed("smashed_noise", {"sigma": 0.5}, Z, COUNTS, BAD, [torch_rng(7, "adversary-smashed", 1)])
    real = Z[1, :2]
    want = real + 0.5 * real.std(correction=0) * torch.randn(
        real.shape, generator=torch_rng(7, "adversary-smashed", 1)
    )
    assert torch.allclose(noise[1, :2], want) and torch.equal(noise[1, 2], Z[1, 2])
    assert torch.equal(noise[0], Z[0])


def _digits(tmp_path: Path, algorithm: str, adversary: dict | None, stages: list | None = None) -> Any:
    """Three rounds of ``algorithm`` on digits, 10 iid clients, an MLP cut after its first layer."""
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": 3,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1},
        "algorithm": {"name": algorithm, "optimizer": {"lr": 0.1}},
        "aggregation": {"stages": stages or []},
        "engine": {"threads": 1},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    if adversary is not None:
        config["adversary"] = adversary
    return fedge.run(config)


def test_poisoned_smashed_data_breaks_cse_fsls_server_model_not_its_aux_head(tmp_path):
    honest = _digits(tmp_path, "cse_fsl", None)
    flip = {"clients": [0, 1], "attack": "smashed_flip", "options": {"scale": 10.0}}
    noise = {"clients": [0, 1], "attack": "smashed_noise", "options": {"sigma": 10.0}}
    flipped, noised = _digits(tmp_path, "cse_fsl", flip), _digits(tmp_path, "cse_fsl", noise)
    clean = honest.summary["final_accuracy"]
    assert flipped.summary["final_accuracy"] < clean - 0.3 and noised.summary["final_accuracy"] < clean - 0.1
    # the clients' own aux heads never see the server: the local model keeps learning
    assert flipped.metrics[-1]["aux_accuracy"] > clean - 0.1
    assert [m["malicious"] for m in flipped.metrics] == [2, 2, 2] and flipped.summary["malicious"] == 6


def test_sign_flip_on_the_client_models_breaks_the_mean_not_the_median(tmp_path):
    adversary = {"clients": [0, 1], "attack": "sign_flip", "options": {"scale": 4.0}}
    clean = _digits(tmp_path, "cse_fsl", None).summary["final_accuracy"]
    mean = _digits(tmp_path, "cse_fsl", adversary)
    median = _digits(tmp_path, "cse_fsl", adversary, [{"name": "median", "at": ["server"]}])
    assert mean.summary["final_accuracy"] < clean - 0.1
    assert median.summary["final_accuracy"] > mean.summary["final_accuracy"] + 0.1
    assert mean.summary["malicious_kept"] == pytest.approx(0.2, abs=0.01)  # 2 of 10 near-equal shards
    assert median.summary["malicious_kept"] < 0.1


def _recorded(monkeypatch, config: dict) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Any]:
    """The (smashed data, labels) of every batch the shared server served, and the run's result."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def recording(self, batch, lr, grad_z, order):
        seen.append((batch.z.clone(), batch.y.clone()))
        return SERVE(self, batch, lr, grad_z, order)

    monkeypatch.setattr(SharedServer, "serve", recording)
    return seen, fedge.run(config)


def _tiny(tmp_path: Path, algorithm: str, adversary: dict | None, **engine: Any) -> dict:
    config = tiny(algorithm, tmp_path / "runs", rounds=2)
    config["algorithm"].update(batch_size=8)
    config["engine"] = {"threads": 1, **engine}
    if adversary is not None:
        config["adversary"] = adversary
    return config


def test_label_flip_changes_the_labels_the_server_and_the_aux_head_see(tmp_path, monkeypatch):
    local: list[torch.Tensor] = []

    def recording(self, state, batch, *args, **kwargs):
        local.append(batch[1].clone())
        return STEP(self, state, batch, *args, **kwargs)

    monkeypatch.setattr(AuxHeadClients, "step", recording)
    honest, _ = _recorded(monkeypatch, _tiny(tmp_path, "cse_fsl", None))
    honest_local, local[:] = list(local), []
    adversary = {"clients": [2], "attack": "label_flip", "start_round": 2}
    attacked, result = _recorded(monkeypatch, _tiny(tmp_path, "cse_fsl", adversary))
    assert [m["malicious"] for m in result.metrics] == [0, 1]
    half = len(honest) // 2  # the rounds serve as many batches each; round 1 is honest
    for (_, y_h), (_, y_a) in zip(honest[:half], attacked[:half], strict=True):
        assert torch.equal(y_h, y_a)
    for (_, y_h), (_, y_a) in zip(honest[half:], attacked[half:], strict=True):
        assert torch.equal(y_a[2], 3 - y_h[2])  # client 2 is row 2 under full participation; 4 classes
        assert torch.equal(y_a[[0, 1, 3]], y_h[[0, 1, 3]])
    steps = len(honest_local) // 2  # the aux head's labels: flipped for the malicious row alike
    assert torch.equal(local[steps][2], 3 - honest_local[steps][2])
    assert torch.equal(local[steps][0], honest_local[steps][0])


def test_the_smashed_data_the_server_sees_is_the_malicious_rows_flip(tmp_path, monkeypatch):
    honest, _ = _recorded(monkeypatch, _tiny(tmp_path, "cse_fsl", None))
    adversary = {"clients": [1], "attack": "smashed_flip", "options": {"scale": 3.0}}
    attacked, _ = _recorded(monkeypatch, _tiny(tmp_path, "cse_fsl", adversary))
    (z_h, _), (z_a, _) = honest[0], attacked[0]  # round 1's first upload: the same client models
    assert torch.allclose(z_a[1], -3.0 * z_h[1]) and torch.equal(z_a[[0, 2, 3]], z_h[[0, 2, 3]])


def _numbers(result: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "wall_seconds"} for m in result.metrics]


@pytest.mark.parametrize(
    ("algorithm", "attack"),
    [
        ("cse_fsl", "smashed_noise"),
        ("splitfed_v1", "smashed_noise"),
        ("splitfed_v2", "gaussian"),
        ("fsl_an", "label_flip"),
        ("fsl_sage", "alie"),
    ],
)
def test_both_executors_attack_alike_and_runs_repeat(tmp_path, algorithm, attack):
    adversary = {"clients": [0, 3], "attack": attack}
    runs = [
        fedge.run(_tiny(tmp_path, algorithm, adversary, executor=executor))
        for executor in ("sequential", "batched", "batched")
    ]
    honest = fedge.run(_tiny(tmp_path, algorithm, None, executor="batched"))
    for key in ("accuracy", "train_loss", "server_loss", "malicious_kept"):
        assert runs[0].metrics[-1][key] == pytest.approx(runs[1].metrics[-1][key], abs=1e-5)
    assert _numbers(runs[1]) == _numbers(runs[2])  # seeded: the same run twice
    assert _numbers(runs[1])[-1]["accuracy"] != honest.metrics[-1]["accuracy"]  # the attack acted


def test_a_run_whose_malicious_clients_never_attack_is_the_honest_run(tmp_path):
    honest = fedge.run(_tiny(tmp_path, "splitfed_v1", None))
    assert "malicious" not in honest.metrics[-1] and "malicious" not in honest.summary
    for attack in ("smashed_noise", "ipm", "label_flip"):
        late = {"clients": [1, 2], "attack": attack, "start_round": 3}  # the run has two rounds
        result = fedge.run(_tiny(tmp_path, "splitfed_v1", late))
        plain = [
            {k: v for k, v in m.items() if k not in ("malicious", "malicious_kept")} for m in _numbers(result)
        ]
        assert plain == _numbers(honest)
        assert result.summary["malicious"] == 0 and result.summary["malicious_kept"] is None


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"adversary": {"clients": 0.25, "attack": "smashed_noise"}}, "adversary.attack"),  # fedavg
        (
            {
                "algorithm": {"name": "cse_fsl"},
                "adversary": {"clients": 0.25, "attack": "smashed_noise", "options": {"scale": 2}},
            },
            "adversary.options.scale",
        ),
        (
            {
                "algorithm": {"name": "cse_fsl"},
                "adversary": {"clients": 0.25, "attack": "smashed_flip", "options": {"scale": 0}},
            },
            "adversary.options.scale",
        ),
        (
            {"algorithm": {"name": "light_fedsl"}, "adversary": {"clients": 0.5, "attack": "backdoor"}},
            "adversary.attack",
        ),
        (
            {"algorithm": {"name": "cse_fsl_async"}, "adversary": {"clients": 0.5, "attack": "ipm"}},
            "adversary",
        ),
    ],
)
def test_bad_split_adversaries_are_refused_naming_the_key(config, key):
    with pytest.raises(ConfigError) as error:
        parse_config({"partition": {"num_clients": 4}, **config})
    assert error.value.key == key and "\n" not in str(error.value)


def test_label_flip_with_randomized_labels_is_refused(tmp_path):
    config = _tiny(tmp_path, "cse_fsl", {"clients": [1], "attack": "label_flip"})
    config["privacy"] = {"labels": {"epsilon": 2.0}}
    with pytest.raises(ConfigError, match="^adversary.attack: label_flip"):
        fedge.run(config)


def test_a_deployed_split_run_takes_an_adversary_as_the_peers_do_and_fedbuff_refuses_it(tmp_path):
    pytest.importorskip("flwr")
    from fedge.deploy.rounds import check_stages

    adversary = {"clients": [1], "attack": "label_flip"}
    check_stages(parse_config(_tiny(tmp_path, "cse_fsl", adversary)))  # tests/deploy/test_split_deployed.py
    check_stages(parse_config(_tiny(tmp_path, "gossip", adversary)))  # tests/deploy/test_adversary_deployed
    with pytest.raises(ConfigError, match="^adversary: deploys with fedavg, .*, not fedbuff") as err:
        check_stages(parse_config(_tiny(tmp_path, "fedbuff", adversary)))
    assert "\n" not in str(err.value)
