"""Clients' optimizer state across rounds (``client_optimizer_state: reset | keep``) in the split family
and FedAvg: keeping it changes training only where there is state (momentum, Adam), gives each client
back its own, and survives a checkpoint exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cases import killed_after, tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.optimizer_state import ClientOptimizerStates
from fedge.distributed import SINGLE_PROCESS
from fedge.engine import SGD


def split_run(algorithm: str, out: Path, name: str, state: str, optimizer: dict[str, Any], **extra: Any):
    config = tiny(algorithm, out, rounds=3)
    config["algorithm"].update(client_optimizer_state=state, optimizer={"lr": 0.05, **optimizer}, **extra)
    if algorithm == "fedavg":
        config["algorithm"]["batch_size"] = 10
    config["output"]["name"] = name
    config["eval"] = {"every": 1}
    return config


def _numbers(result: fedge.Result) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in result.metrics]


@pytest.mark.parametrize("algorithm", ["cse_fsl", "splitfed_v1", "splitfed_v2", "fsl_an", "fedavg"])
@parametrize_first_by_default(
    "optimizer", [{"momentum": 0.9}, {"kind": "adam", "lr": 0.01}], ids=["momentum", "adam"]
)
def test_keeping_the_client_optimizer_state_changes_training_with_momentum_or_adam(
    tmp_path, algorithm, optimizer
):
    runs = [fedge.run(split_run(algorithm, tmp_path, s, s, optimizer)) for s in ("reset", "keep")]
    reset, keep = (_numbers(r) for r in runs)
    assert reset[0] == keep[0]  # the first round starts fresh either way
    assert reset[1]["train_loss"] != keep[1]["train_loss"]


@parametrize_first_by_default("algorithm", ["cse_fsl", "splitfed_v2", "fedavg"])
def test_plain_sgd_has_no_state_to_keep(tmp_path, algorithm):
    runs = [fedge.run(split_run(algorithm, tmp_path, s, s, {})) for s in ("reset", "keep")]
    assert _numbers(runs[0]) == _numbers(runs[1])


def test_each_client_gets_back_its_own_state_and_duplicates_keep_their_mean():
    """Round one: clients 2, 0, 2 (client 2 drawn twice); round two: clients 0 and 1."""
    states = ClientOptimizerStates(SGD(momentum=0.9), keep=True)
    params = {"w": torch.zeros(3)}
    first = states.start((2, 0, 2), params)
    assert torch.equal(first["w"], torch.zeros(3, 3))
    trained = torch.tensor([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]])
    states.end(np.array([2, 0, 2]), {"w": trained}, SINGLE_PROCESS.of(3))
    assert states.kept[2]["w"].tolist() == [2.0, 2.0, 2.0] and states.kept[0]["w"].tolist() == [2.0] * 3
    second = states.start((0, 1), params)
    assert second["w"].tolist() == [[2.0] * 3, [0.0] * 3]  # client 1's first visit starts fresh
    assert ClientOptimizerStates(SGD(momentum=0.9), keep=False).start((0, 1), params)["w"].abs().sum() == 0


RESUMED = {
    "cse_fsl-full": ("cse_fsl", {}),
    "cse_fsl-with-replacement": ("cse_fsl", {"participation": "with_replacement", "clients_per_round": 4}),
    "fedavg-half": ("fedavg", {"fraction": 0.5}),
}


@parametrize_first_by_default("case", list(RESUMED))
def test_a_resumed_run_that_keeps_client_optimizer_states_equals_an_uninterrupted_one(tmp_path, case):
    algorithm, extra = RESUMED[case]
    config = split_run(algorithm, tmp_path, "cut", "keep", {"kind": "adam", "lr": 0.01}, **extra)
    config["rounds"] = 4
    config["output"]["checkpoint_every"] = 1

    killed_after(config, 2)
    resumed = fedge.resume(tmp_path / "cut")
    reference = fedge.run({**config, "output": {**config["output"], "name": "whole"}})
    assert len(resumed.metrics) == 4 and _numbers(resumed) == _numbers(reference)
