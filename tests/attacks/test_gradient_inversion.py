"""Gradient inversion of a FedAvg update (fedge.attacks.gradient_inversion) on the 8x8 digits: one local
SGD step's update gives back the gradient, iDLG's rule reads the label off the last layer, and the cosine
attack recovers a single digit through a sigmoid MLP and a tiny CNN; larger batches leak less; frozen
parameters are skipped, restarts keep the best, and bad input is refused in one line."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from fedge.attacks.gradient_inversion import gradient_from_update, infer_labels, invert_gradients
from fedge.attacks.metrics import match_reconstructions, psnr

BOUNDS = (0.0, 1.0)
LOCAL_LR = 0.1
ATTACK = {"steps": 200, "lr": 0.1, "bounds": BOUNDS}


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 digits flattened to 64 pixels in [0, 1], and their labels."""
    bunch = load_digits()
    return torch.tensor(bunch.data / 16.0, dtype=torch.float32), torch.tensor(bunch.target)


def seeded(model: nn.Module, seed: int) -> nn.Module:
    """``model`` with every parameter drawn uniformly in +-1/sqrt(fan-in) from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.5
            p.copy_((2 * torch.rand(p.shape, generator=generator) - 1) * bound)
    return model


def mlp(seed: int = 0) -> nn.Module:
    """64 -> 32 -> 10 with a sigmoid, as Zhu et al. use: smooth, so the attack's second derivatives carry
    signal, and positive inputs to the last layer, which the label rule needs."""
    return seeded(nn.Sequential(nn.Linear(64, 32), nn.Sigmoid(), nn.Linear(32, 10)), seed)


def cnn(seed: int = 0) -> nn.Module:
    return seeded(
        nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Sigmoid(), nn.Flatten(), nn.Linear(256, 10)), seed
    )


def fedavg_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[dict, dict]:
    """The global parameters and a client's update ``new - global`` after one local SGD step on ``(x, y)``."""
    client = copy.deepcopy(model)
    start = {name: p.detach().clone() for name, p in client.named_parameters()}
    optimiser = torch.optim.SGD(client.parameters(), lr=LOCAL_LR)
    F.cross_entropy(client(x), y).backward()
    optimiser.step()
    return start, {name: p.detach() - start[name] for name, p in client.named_parameters()}


def attack(model: nn.Module, x: torch.Tensor, y: torch.Tensor, last: str, seed: int = 0, **kw):
    """The server's attack on one FedAvg update: labels from the last layer, then the inversion; the
    inferred labels and the PSNR of each matched reconstruction."""
    params, update = fedavg_step(model, x, y)
    gradient = gradient_from_update(update, LOCAL_LR)
    labels = infer_labels(gradient[last], len(y))
    options = {**ATTACK, "tv_weight": 0.0, **kw}
    recovered = invert_gradients(
        model,
        params,
        gradient,
        tuple(x.shape[1:]),
        labels,
        generator=torch.Generator().manual_seed(seed),
        **options,
    )
    return labels, psnr(x, recovered[match_reconstructions(x, recovered)], 1.0)


def test_one_step_update_gives_back_the_gradient(digits):
    model, x, y = mlp(), digits[0][:8], digits[1][:8]
    _, update = fedavg_step(model, x, y)
    expected = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    for got, want in zip(gradient_from_update(update, LOCAL_LR).values(), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("index", range(10))
def test_a_single_label_is_the_negative_row(digits, index):
    x, y = digits[0][index : index + 1], digits[1][index : index + 1]
    gradient = gradient_from_update(fedavg_step(mlp(), x, y)[1], LOCAL_LR)
    assert infer_labels(gradient["2.weight"], 1).tolist() == y.tolist()
    assert infer_labels(gradient["2.bias"], 1).tolist() == y.tolist()


def test_a_batch_with_repeated_labels_is_counted_by_magnitude(digits):
    x, y = digits
    chosen = torch.cat([torch.nonzero(y == 3).flatten()[:3], torch.nonzero(y == 7).flatten()[:1]])
    gradient = gradient_from_update(fedavg_step(mlp(), x[chosen], y[chosen])[1], LOCAL_LR)
    assert sorted(infer_labels(gradient["2.weight"], 4).tolist()) == [3, 3, 3, 7]


def test_count_heuristic_by_hand():
    grad = torch.tensor([-0.3, 0.2, -0.1, 0.2])
    assert infer_labels(grad, 1).tolist() == [0]  # the most negative row
    assert infer_labels(grad, 2).tolist() == [0, 2]
    # one label per negative row; the two left go to row 0 (0.3/2 and 0.3/3 both beat row 2's 0.1/2)
    assert sorted(infer_labels(grad, 4).tolist()) == [0, 0, 0, 2]


def test_mlp_update_gives_back_the_digit_and_its_label(digits):
    x, y = digits[0][:1], digits[1][:1]
    labels, figure = attack(mlp(), x, y, "2.weight")
    assert labels.tolist() == y.tolist()
    assert figure.item() > 20


def test_cnn_update_gives_back_the_digit_and_its_label(digits):
    x, y = digits[0][:1].reshape(1, 1, 8, 8), digits[1][:1]
    labels, figure = attack(cnn(), x, y, "3.weight", tv_weight=1e-4)
    assert labels.tolist() == y.tolist()
    assert figure.item() > 20  # about 47 dB with these settings


def test_larger_batches_leak_less(digits):
    figures = {
        size: attack(mlp(), digits[0][:size], digits[1][:size], "2.weight")[1].mean().item()
        for size in (1, 4, 16)
    }
    assert figures[1] > figures[16] + 10
    assert figures[4] > figures[16]


def test_frozen_parameters_are_skipped(digits):
    model, x, y = mlp(), digits[0][:1], digits[1][:1]
    params, update = fedavg_step(model, x, y)
    gradient = gradient_from_update(update, LOCAL_LR)
    target = {name: gradient[name] for name in ("0.weight", "2.weight")}  # the biases frozen
    recovered = invert_gradients(
        model, params, target, (64,), y, tv_weight=0.0, generator=torch.Generator().manual_seed(0), **ATTACK
    )
    assert psnr(x, recovered, 1.0).item() > 20


def test_restarts_keep_the_best_and_runs_repeat(digits):
    model, x, y = mlp(), digits[0][:4], digits[1][:4]
    params, update = fedavg_step(model, x, y)
    gradient = gradient_from_update(update, LOCAL_LR)
    options = {"steps": 20, "lr": 0.1, "tv_weight": 0.0, "bounds": BOUNDS}

    def run(restarts: int) -> torch.Tensor:
        return invert_gradients(
            model,
            params,
            gradient,
            (64,),
            y,
            generator=torch.Generator().manual_seed(0),
            restarts=restarts,
            **options,
        )

    def distance(candidate: torch.Tensor) -> float:
        grads = torch.autograd.grad(F.cross_entropy(model(candidate), y), list(model.parameters()))
        flat = torch.cat([g.flatten() for g in grads])
        goal = torch.cat([g.flatten() for g in gradient.values()])
        return 1 - F.cosine_similarity(flat, goal, dim=0).item()

    one, three = run(1), run(3)
    assert torch.equal(one, run(1))
    assert distance(three) <= distance(one) + 1e-7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"target": {"nope": torch.zeros(1)}}, "not a parameter"),
        ({"target": {"2.bias": torch.zeros(3)}}, "shape"),
        ({"target": {}}, "no gradient"),
        ({"labels": torch.zeros(1)}, "LongTensor"),
        ({"steps": 0}, "positive"),
        ({"bounds": (1.0, 1.0)}, "low < high"),
    ],
)
def test_bad_inversion_input_is_refused_in_one_line(change, message):
    model = mlp()
    params = {name: p.detach() for name, p in model.named_parameters()}
    call = {
        "target": dict(params),
        "labels": torch.tensor([1]),
        "steps": 5,
        "lr": 0.1,
        "tv_weight": 0.0,
        "bounds": BOUNDS,
        **change,
    }
    target, labels = call.pop("target"), call.pop("labels")
    with pytest.raises(ValueError, match=rf"^[^\n]*{message}[^\n]*$"):
        invert_gradients(model, params, target, (64,), labels, generator=torch.Generator(), **call)


@pytest.mark.parametrize(
    "call",
    [
        lambda: infer_labels(torch.tensor([0.1, 0.0, 0.2]), 1),  # no negative row
        lambda: infer_labels(torch.tensor([-0.1, 0.1]), 0),
        lambda: infer_labels(torch.zeros(2, 2, 2), 1),
        lambda: gradient_from_update({"w": torch.ones(1)}, 0.0),
    ],
)
def test_bad_label_or_update_input_is_refused_in_one_line(call):
    with pytest.raises(ValueError, match=r"^[^\n]+$"):
        call()
