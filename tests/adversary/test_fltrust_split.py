"""FLTrust at the split server's client-model average (fedge.algorithms.split.root): sign-flipping
clients' client models get no trust and accuracy holds where the mean falls, both executors agree, the
root training leaves the server part alone and its FLOPs reach the clock, and SplitFed v1's server copies
are refused in one line naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fedge
from fedge.algorithms.split import root
from fedge.errors import ConfigError

TRUST = [{"name": "fltrust", "at": ["server"]}]
FLIP = {"clients": [0, 1], "attack": "sign_flip", "options": {"scale": 4.0}}


def _config(tmp_path: Path, algorithm: str, attacked: bool, stages: list, executor: str = "batched") -> Any:
    """Three rounds of ``algorithm`` on digits, 10 iid clients, an MLP cut after its first layer."""
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": 3,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1},
        "algorithm": {"name": algorithm, "optimizer": {"lr": 0.1}},
        "aggregation": {"stages": stages},
        "engine": {"threads": 1, "executor": executor},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    if attacked:
        config["adversary"] = FLIP
    return config


@pytest.mark.parametrize("algorithm", ["splitfed_v2", "cse_fsl"])
def test_fltrust_gives_sign_flipped_client_models_no_trust(tmp_path, algorithm):
    clean = fedge.run(_config(tmp_path, algorithm, False, [])).summary["final_accuracy"]
    mean = fedge.run(_config(tmp_path, algorithm, True, []))
    trusted = fedge.run(_config(tmp_path, algorithm, True, TRUST))
    assert mean.summary["final_accuracy"] < clean - 0.15
    assert trusted.summary["final_accuracy"] > clean - 0.03
    assert [m["malicious_kept"] for m in trusted.metrics] == [0.0, 0.0, 0.0]
    assert all(m["malicious_kept"] > 0.1 for m in mean.metrics)


def test_executors_agree_and_the_root_training_is_charged_leaving_the_server_part(tmp_path, monkeypatch):
    seen: list[tuple[dict[str, torch.Tensor], float]] = []
    train = root.split_root_update

    def spy(ctx, cfg, parts, reducer, sgd, work, client, server):  # noqa: ANN001, ANN202
        before = {k: v.clone() for k, v in server.items()}
        update = train(ctx, cfg, parts, reducer, sgd, work, client, server)
        assert all(torch.equal(before[k], server[k]) for k in server)
        seen.append((update.model, update.flops))
        return update

    monkeypatch.setattr("fedge.algorithms.split.protocol.split_root_update", spy)
    executors = ("sequential", "batched")
    runs = [fedge.run(_config(tmp_path / e, "fsl_sage", True, TRUST, e)).metrics for e in executors]
    for a, b in zip(*runs, strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
        assert a["malicious_kept"] == b["malicious_kept"] == 0.0
    assert len(seen) == 6 and all(flops > 0 for _, flops in seen)
    assert any(k.startswith("aux.") for k in seen[0][0])  # FSL-SAGE's averaged aux head trained too


def test_fltrust_at_splitfed_v1s_server_copies_is_refused(tmp_path):
    refused = r"^aggregation.stages.0.name: fltrust needs the server's root"
    with pytest.raises(ConfigError, match=refused) as error:
        fedge.run(_config(tmp_path, "splitfed_v1", False, TRUST))
    assert "\n" not in str(error.value)
