"""Malicious clients of an asynchronous server (fedge.runtime.buffer_adversary): each attacking update is
its delta from the version it trained from poisoned, over the honest deltas of the buffer; the buffer's
rows carry it on both of FedBuff's paths; a scaling attack breaks FedBuff's mean and a trimmed mean or
Krum at the buffer recovers much of it; ``malicious_kept`` reads the buffer's reducer (FedAsync: the
mixing weight); both executors agree, a run resumes to the same numbers, a run whose attackers never
start is unchanged, and bad configs are refused naming the key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedge
from fedge.config import AdversaryConfig
from fedge.errors import ConfigError
from fedge.runtime.adversary import Adversary, alie_z
from fedge.runtime.buffer_adversary import poisoned_updates

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import killed_after, reduced, tiny  # noqa: E402


def test_each_attacking_update_is_its_own_delta_poisoned_over_the_honest_deltas():
    bases = [{"w": torch.full((3,), float(i))} for i in range(4)]  # each update trained from its version
    models = [{"w": b["w"] + torch.tensor([1.0, -2.0, 0.5]) * (i + 1)} for i, b in enumerate(bases)]
    clients = np.array([7, 3, 5, 9])
    deltas = torch.stack([m["w"] - b["w"] for m, b in zip(models, bases, strict=True)]).double()
    honest = deltas[[0, 2]]
    for attack, options, want in (
        ("sign_flip", {"scale": 2.0}, lambda d: -2.0 * d),
        ("scaling", {}, lambda d: 2.0 * d),  # 4 updates, 2 malicious
        ("alie", {}, lambda d: honest.mean(0) - alie_z(4, 2) * honest.std(0, correction=1)),
        ("ipm", {"epsilon": 0.5}, lambda d: -0.5 * honest.mean(0)),
    ):
        config = AdversaryConfig(clients=[3, 9], attack=attack, options=options)
        out = poisoned_updates(Adversary(config, np.array([3, 9]), 0), 1, clients, models, bases)
        assert out[0] is models[0] and out[2] is models[2]  # the honest updates as they arrived
        for i in (1, 3):
            assert torch.allclose(out[i]["w"].double(), bases[i]["w"].double() + want(deltas[i]), atol=1e-6)


def _config(tmp_path: Path, algorithm: str, adversary: dict | None, **options: Any) -> dict[str, Any]:
    config = tiny(algorithm, tmp_path / "runs", rounds=3)
    config["partition"]["num_clients"] = 8
    config["algorithm"].update(options)
    if adversary is not None:
        config["adversary"] = adversary
    return config


@pytest.mark.parametrize("server_lr", [1.0, 0.5])  # the fresh models' average, or the deltas' step
def test_the_buffers_rows_carry_the_attack(tmp_path, monkeypatch, server_lr):
    honest, _ = reduced(monkeypatch, _config(tmp_path, "fedbuff", None, server_lr=server_lr))
    adversary = {"clients": [1, 6], "attack": "sign_flip", "options": {"scale": 2.0}}
    attacked, result = reduced(monkeypatch, _config(tmp_path, "fedbuff", adversary, server_lr=server_lr))
    first_h, first_a = honest[0].parts[0].rows, attacked[0].parts[0].rows  # the first flush: all of them
    reference = attacked[0].reference  # the model they trained from, or no change
    for name, rows in first_a.items():
        for i in range(8):
            want = first_h[name][i]
            if i in (1, 6):
                want = reference[name] - 2.0 * (want - reference[name])
            assert torch.allclose(rows[i], want, atol=1e-6)
    assert [m["malicious"] for m in result.metrics] == [2, 2, 2]
    assert result.metrics[0]["malicious_kept"] == pytest.approx(0.25)  # uniform weights, 2 of 8


def test_scaling_breaks_fedbuffs_mean_not_a_trimmed_mean_or_krum_at_the_buffer(tmp_path):
    def digits(stages: list[Any], attacked: bool) -> dict[str, Any]:
        config: dict[str, Any] = {
            "seed": 1,
            "rounds": 10,
            "data": {"name": "digits"},
            "partition": {"kind": "iid", "num_clients": 10},
            "model": {"name": "mlp", "options": {"hidden": [32]}},
            "algorithm": {"name": "fedbuff", "fraction": 1.0, "buffer_size": 5, "optimizer": {"lr": 0.1}},
            "aggregation": {"stages": stages},
            "output": {"dir": str(tmp_path), "plots": False},
        }
        if attacked:
            config["adversary"] = {"clients": [0, 1], "attack": "scaling", "options": {"scale": 20.0}}
        return fedge.run(config).summary

    clean, mean = digits([], False), digits([], True)
    trimmed = digits([{"name": "trimmed_mean", "options": {"trim": 0.4}, "at": ["buffer"]}], True)
    krum = digits([{"name": "krum", "options": {"byzantine": 1}, "at": ["buffer"]}], True)
    assert mean["final_accuracy"] < clean["final_accuracy"] - 0.2
    assert trimmed["final_accuracy"] > mean["final_accuracy"] + 0.2
    assert krum["final_accuracy"] > mean["final_accuracy"] + 0.1
    assert krum["malicious_kept"] < trimmed["malicious_kept"] < mean["malicious_kept"]


@pytest.mark.parametrize("attack", ["gaussian", "alie", "label_flip"])
def test_both_executors_poison_alike(tmp_path, monkeypatch, attack):
    adversary = {"clients": 0.25, "attack": attack}
    runs = []
    for executor in ("sequential", "batched"):
        config = _config(tmp_path, "fedbuff", adversary, buffer_size=3)
        config["engine"] = {"executor": executor}
        runs.append(reduced(monkeypatch, config))
    (seq, first), (bat, second) = runs
    for a, b in zip(seq, bat, strict=True):
        for name, rows in a.parts[0].rows.items():
            assert torch.allclose(rows.double(), b.parts[0].rows[name].double(), atol=1e-5)
    assert [m["malicious"] for m in first.metrics] == [m["malicious"] for m in second.metrics]
    assert first.metrics[-1]["accuracy"] == pytest.approx(second.metrics[-1]["accuracy"], abs=1e-6)


def test_an_attacked_run_resumes_to_the_same_numbers(tmp_path):
    adversary = {"clients": [2, 5], "attack": "gaussian"}
    whole = fedge.run(_config(tmp_path / "whole", "fedbuff", adversary, buffer_size=3))
    config = _config(tmp_path / "cut", "fedbuff", adversary, buffer_size=3)
    config["output"]["name"] = "cut"
    killed_after(config, 2)
    resumed = fedge.resume(tmp_path / "cut" / "runs" / "cut")

    def numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]

    assert numbers(resumed.metrics) == numbers(whole.metrics)


def test_fedasyncs_kept_share_is_its_mixing_weight(tmp_path):
    adversary = {"clients": [0, 1, 2, 3], "attack": "sign_flip"}
    result = fedge.run(_config(tmp_path, "fedasync", adversary, staleness="constant", mixing=0.5))
    attacked = [m for m in result.metrics if m["malicious"]]
    assert attacked and all(m["malicious"] == 1 for m in attacked)
    assert all(m["malicious_kept"] == pytest.approx(0.5) for m in attacked)


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync"])
def test_attackers_that_never_start_change_no_number(tmp_path, algorithm):
    options = {"buffer_size": 3} if algorithm == "fedbuff" else {}  # stale updates: the deltas' path
    plain = fedge.run(_config(tmp_path, algorithm, None, **options))
    adversary = {"clients": [0, 5], "attack": "sign_flip", "start_round": 9}
    late = fedge.run(_config(tmp_path, algorithm, adversary, **options))
    assert "malicious" not in plain.metrics[-1] and "malicious" not in plain.summary

    def numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("wall_seconds", "malicious", "malicious_kept")}
                for r in rows]  # fmt: skip

    assert numbers(plain.metrics) == numbers(late.metrics)
    assert late.summary["malicious"] == 0 and late.summary["malicious_kept"] is None


@pytest.mark.parametrize("attack", ["alie", "ipm"])
def test_fedasync_refuses_the_attacks_that_read_honest_updates(tmp_path, attack):
    with pytest.raises(ConfigError) as error:
        fedge.run(_config(tmp_path, "fedasync", {"clients": 0.25, "attack": attack}))
    assert error.value.key == "adversary.attack" and "one update at a time" in str(error.value)
