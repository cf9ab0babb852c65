"""FedFomo: the weight rule against a hand-computed case, the validation split, the plumbing of losses and
distances through the batched probes, and CLI runs with random and AFIND+ peers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from torch.func import functional_call
from typer.testing import CliRunner

from fedge.algorithms.decentralized.fedfomo import fomo_weights
from fedge.cli.commands import app
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.runner.loop import build_run

runner = CliRunner()


def config(tmp_path, **algorithm) -> dict:
    """Six clients on a small synthetic set, full graph, two peers each."""
    return {
        "seed": 3,
        "rounds": 2,
        "data": {
            "name": "synthetic",
            "num_train": 360,
            "num_test": 120,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "dirichlet", "num_clients": 6, "alpha": 0.5, "min_size": 10},
        "model": {"name": "mlp", "options": {"hidden": [12, 8]}},
        "algorithm": {
            "name": "fedfomo",
            "local_epochs": 1,
            "batch_size": 16,
            "peers": 2,
            "optimizer": {"lr": 0.1, "momentum": 0.5},
            **algorithm,
        },
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }


def test_weight_rule_matches_a_hand_computed_three_client_case():
    own = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    nan = float("nan")
    peer = torch.tensor([[nan, 0.6, 0.9], [0.7, nan, 1.0], [1.0, 1.5, nan]], dtype=torch.float64)
    distance = torch.tensor([[0, 2.0, 0.5], [2.0, 0, 1.0], [0.5, 1.0, 0]], dtype=torch.float64)
    received = ~torch.eye(3, dtype=torch.bool)
    # client 0: u = (1 - 0.6)/2 = 0.2 and (1 - 0.9)/0.5 = 0.2 -> 1/2 each
    # client 1: both peers are worse on its data (0.7, 1.0 > 0.5) -> keeps its own model
    # client 2: u = (2 - 1)/0.5 = 2 and (2 - 1.5)/1 = 0.5 -> 0.8, 0.2
    expected = torch.tensor([[0, 0.5, 0.5], [0, 1, 0], [0.8, 0.2, 0]], dtype=torch.float64)
    assert torch.allclose(fomo_weights(own, peer, distance, received), expected)
    # a peer not received gets nothing, even if it would help; a model at distance 0 cannot move a client
    received[2, 0] = False
    distance[0, 2] = 0.0
    weights = fomo_weights(own, peer, distance, received)
    assert torch.allclose(weights[2], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    assert torch.allclose(weights[0], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


def test_validation_split_is_held_out_from_training(tmp_path):
    algorithm = build_run(parse_config(config(tmp_path, val_fraction=0.25))).algorithm
    data = algorithm.ctx.data
    for k, ix in enumerate(data.client_train):
        index, weight = algorithm.validation.index[k], algorithm.validation.weight[k]
        held = set(index[weight > 0].tolist())
        train = set(algorithm.train_data.client_train[k].tolist())
        assert held.isdisjoint(train) and held | train == set(ix.tolist())
        assert len(held) == round(0.25 * len(ix))
    plan = algorithm.train_data.batch_plan([0], 1, 1, 16, False)
    assert set(plan.index[0][plan.weight[0] > 0].tolist()) <= set(
        algorithm.train_data.client_train[0].tolist()
    )


def test_round_moves_each_client_by_the_rule_on_its_validation_split(tmp_path):
    algorithm = build_run(parse_config(config(tmp_path, local_epochs=1))).algorithm
    algorithm.run_round(1)  # clients now differ
    bank, model, data = algorithm.bank, algorithm.model, algorithm.ctx.data
    received = torch.as_tensor(algorithm.random_peers(2))
    n = algorithm.num_clients

    def loss(i: int, n_: int) -> float:
        state = {k: v[n_] for k, v in {**bank.params, **bank.buffers}.items()}
        ix = algorithm.validation.index[i][algorithm.validation.weight[i] > 0]
        model.eval()
        logits = functional_call(model, state, (data.x_train[ix],))
        return float(torch.nn.functional.cross_entropy(logits.double(), data.y_train[ix]))

    flat = torch.cat([v.reshape(n, -1).double() for v in bank.params.values()], dim=1)
    own = torch.tensor([loss(i, i) for i in range(n)], dtype=torch.float64)
    peer = torch.tensor([[loss(i, j) for j in range(n)] for i in range(n)], dtype=torch.float64)
    distance = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
    expected = fomo_weights(own, peer, distance, received)
    weights = algorithm.weights(received)
    assert torch.allclose(weights, expected, atol=1e-5)
    assert torch.allclose(weights.sum(dim=1), torch.ones(n, dtype=torch.float64))
    assert not (weights * ~(received | torch.eye(n, dtype=torch.bool)) != 0).any()


def test_afind_aggregation_is_fedfomos_own(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.afind.aggregation"):
        parse_config(config(tmp_path, peer_selection="afind", afind={"aggregation": "boltzmann"}))
    with pytest.raises(ConfigError, match="algorithm.val_fraction"):
        parse_config(config(tmp_path, val_fraction=1.0))


@pytest.mark.parametrize("selection", ["random", "afind"])
def test_fedfomo_runs_from_the_cli(tmp_path, selection):
    path = tmp_path / "fomo.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, peer_selection=selection)))
    result = runner.invoke(app, ["run", str(path), "-q"])
    assert result.exit_code == 0, result.output
    run_dir = next((tmp_path / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 0.0 < rows[-1]["accuracy"] <= 1.0 and "kept_own" in rows[-1]
    kinds = {entry["kind"] for entry in summary["ledger_kinds"]}
    assert "peer_model" in kinds and "loss" not in kinds  # FedFomo's weights need no loss reports
    assert ("proxy" in kinds) == (selection == "afind")
    assert np.isfinite(summary["sim_seconds"]) and summary["sim_seconds"] > 0
