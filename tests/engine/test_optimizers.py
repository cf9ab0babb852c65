"""Local optimizers: Adam and SGD follow torch.optim, and both executors train identically with them."""

from __future__ import annotations

import pytest
import torch
from cases import tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.split.parts import composed
from fedge.config import OptimizerConfig
from fedge.engine import Adam, make_optimizer
from fedge.errors import ConfigError
from fedge.runner.loop import build_run

AGREEMENT = 1e-5  # the executors' documented bound (docs/architecture.md, contract 3)


def _torch_steps(kind: str, settings: dict, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight after ``steps`` of torch.optim and of fedge's optimizer on the same gradients."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(5, 3, generator=gen)
    grads = [torch.randn(5, 3, generator=gen) for _ in range(steps)]
    weight = torch.nn.Parameter(start.clone())
    reference = torch.optim.Adam if kind == "adam" else torch.optim.SGD
    options = dict(settings)
    if kind == "adam":
        options["betas"] = (options.pop("beta1"), options.pop("beta2"))
    torch_opt = reference([weight], lr=0.01, **options)
    ours = make_optimizer(OptimizerConfig(kind=kind, lr=0.01, **settings))
    params = {"w": start.clone()}
    state = ours.init(params)
    for g in grads:
        weight.grad = g.clone()
        torch_opt.step()
        params, state = ours.update(params, {"w": g.clone()}, state, 0.01)
    return weight.detach(), params["w"]


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("adam", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
        ("adam", {"beta1": 0.5, "beta2": 0.9, "eps": 1e-6, "weight_decay": 0.01}),
        ("sgd", {"momentum": 0.9, "weight_decay": 1e-3}),
    ],
)
def test_optimizers_follow_torch_optim(kind, settings):
    theirs, ours = _torch_steps(kind, settings, steps=20)
    assert torch.allclose(theirs, ours, rtol=1e-5, atol=1e-6)


def test_adam_pure_and_in_place_updates_are_identical_on_stacked_rows():
    adam = Adam(weight_decay=0.1)
    params = {"w": torch.randn(3, 4, 2)}
    state = adam.init(params, rows=3)
    assert state["step"].shape == (3,)
    state["step"][1] = 5.0  # rows at different step counts keep their own bias corrections
    grads = {"w": torch.randn(3, 4, 2)}
    new_params, new_state = adam.update(params, grads, state, 0.05)
    in_place_params = {k: v.clone() for k, v in params.items()}
    in_place_state = {k: v.clone() for k, v in state.items()}
    adam.update_(in_place_params, {k: v.clone() for k, v in grads.items()}, in_place_state, 0.05)
    assert torch.equal(new_params["w"], in_place_params["w"])
    assert all(torch.equal(new_state[k], in_place_state[k]) for k in new_state)
    row = {"w": params["w"][1]}
    row_state = {k: v[1] for k, v in state.items()}
    alone, _ = adam.update(row, {"w": grads["w"][1]}, row_state, 0.05)
    assert torch.equal(alone["w"], new_params["w"][1])


def test_momentum_belongs_to_sgd():
    with pytest.raises(ConfigError, match="algorithm.optimizer: momentum is SGD's"):
        fedge.resolve_config({"algorithm": {"optimizer": {"kind": "adam", "momentum": 0.9}}})


def _config(algorithm: dict, executor: str) -> dict:
    return {
        "seed": 4,
        "rounds": 3,
        "data": {"name": "synthetic", "num_train": 300, "num_test": 80, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "dirichlet", "num_clients": 5, "alpha": 0.5, "min_size": 12},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [16, 12]}},
        "algorithm": {"batch_size": 8, **algorithm},
        "engine": {"executor": executor},
        "output": {"plots": False},
    }


def _state(built) -> dict[str, torch.Tensor]:
    algorithm = built.algorithm
    if built.config.algorithm.name == "fedavg":
        return algorithm.params
    aux = {k: v for k, v in algorithm.client["params"].items() if k.startswith("aux.")}
    return {**composed(algorithm.client["params"], algorithm.server.params), **aux}


OPTIMIZERS = {
    "adam": {"kind": "adam", "lr": 0.01, "weight_decay": 1e-3},
    "sgd-momentum": {"kind": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
}


@pytest.mark.parametrize("algorithm", ["fedavg", "cse_fsl"])
@parametrize_first_by_default("optimizer", list(OPTIMIZERS))
def test_sequential_and_batched_executors_agree(algorithm, optimizer):
    states, losses = [], []
    for executor in ("sequential", "batched"):
        block = {"name": algorithm, "optimizer": OPTIMIZERS[optimizer]}
        built = build_run(fedge.resolve_config(_config(block, executor)))
        losses.append([built.round(t).train_loss for t in (1, 2, 3)])
        states.append(_state(built))
    gap = max(float((states[0][k] - states[1][k]).abs().max()) for k in states[0])
    assert gap < AGREEMENT, f"{algorithm}/{optimizer}: executors differ by {gap:.2e}"
    assert losses[0] == pytest.approx(losses[1], abs=AGREEMENT)
    assert losses[0][-1] < losses[0][0]  # it learns


def test_adam_in_the_gradient_returning_split_algorithms_agrees_across_executors():
    states = []
    for executor in ("sequential", "batched"):
        block = {"name": "splitfed_v2", "optimizer": OPTIMIZERS["adam"]}
        built = build_run(fedge.resolve_config(_config(block, executor)))
        for t in (1, 2):
            built.round(t)
        states.append(_state(built))
    assert max(float((states[0][k] - states[1][k]).abs().max()) for k in states[0]) < AGREEMENT


# one algorithm per way of holding optimizer state: per-round banks (fsl_an, the server-copy split family),
# the trunk-only step of SplitFed, stacked peer rows (afind, ditto, dispfl, fedavg_ft), HIST's masked
# cells, one learner; lightweight FedSL refuses Adam
ADAM_CASES = [
    "fsl_an",
    "splitfed_v1",
    "afind",
    "ditto",
    "dispfl",
    "fedavg_ft",
    "hist",
    "centralized",
    "light_fedsl",
]


@parametrize_first_by_default("name", ADAM_CASES)
def test_each_kind_of_algorithm_trains_with_adam_or_says_it_cannot(name, tmp_path):
    config = tiny(name, tmp_path, rounds=1)
    config["algorithm"]["optimizer"] = {"kind": "adam", "lr": 0.01}
    if name == "light_fedsl":
        with pytest.raises(ConfigError, match="^algorithm.optimizer.kind: lightweight FedSL is plain SGD"):
            fedge.run(config)
        return
    assert fedge.run(config).summary["status"] == "finished"
