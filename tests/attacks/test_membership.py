"""Membership inference on known answers: an MLP overfit on 64 of sklearn's digits tells its 64 training
samples from 64 held-out ones by their loss (Yeom et al. 2018) and by the loss drop from a reference
model (Watson et al. 2022); a model that saw neither set tells them apart no better than chance."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from fedge.attacks.membership import calibrated_attack, loss_threshold_attack, per_sample_losses

SPLIT = 64


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardised digits, their labels, and seeded disjoint members, non-members and auxiliary data."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1.0)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    return x, torch.tensor(labels), order[:SPLIT], order[SPLIT : 2 * SPLIT], order[2 * SPLIT : 3 * SPLIT]


def overfit(x: torch.Tensor, y: torch.Tensor, seed: int, steps: int = 500) -> nn.Module:
    """A one-hidden-layer MLP trained full-batch far past fitting its samples."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


@pytest.fixture(scope="module")
def losses(digits) -> dict[str, torch.Tensor]:
    """Members' and non-members' losses under the target (trained on the members) and under a reference
    model trained on the auxiliary data only."""
    x, y, members, nonmembers, auxiliary = digits
    target, reference = overfit(x[members], y[members], 0), overfit(x[auxiliary], y[auxiliary], 1)
    return {
        f"{name}_{part}": per_sample_losses(model, x[index], y[index], batch_size=50)
        for name, model in (("target", target), ("reference", reference))
        for part, index in (("members", members), ("nonmembers", nonmembers))
    }


def test_the_loss_tells_an_overfit_models_training_samples(losses):
    result = loss_threshold_attack(losses["target_members"], losses["target_nonmembers"])
    assert result["auc"] > 0.8
    assert 0.0 <= result["tpr_at_1pct_fpr"] <= 1.0
    assert 0.4 < result["advantage"] <= 1.0
    assert (result["members"], result["nonmembers"]) == (SPLIT, SPLIT)


def test_a_model_that_saw_neither_set_tells_nothing(losses):
    result = loss_threshold_attack(losses["reference_members"], losses["reference_nonmembers"])
    assert abs(result["auc"] - 0.5) < 0.12


def test_difficulty_calibration_beats_chance(losses):
    result = calibrated_attack(
        losses["target_members"],
        losses["target_nonmembers"],
        losses["reference_members"],
        losses["reference_nonmembers"],
    )
    assert result["auc"] > 0.55


def test_per_sample_losses_are_cross_entropy_in_eval_mode():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.5), nn.Linear(8, 3)).train()
    x, y = torch.randn(7, 5), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    losses = per_sample_losses(model, x, y, batch_size=3)
    assert model.training
    with torch.no_grad():
        expected = nn.functional.cross_entropy(model.eval()(x), y, reduction="none")
    torch.testing.assert_close(losses, expected)


def test_the_score_orientation_is_low_loss_member():
    result = loss_threshold_attack(torch.tensor([0.1, 0.2]), torch.tensor([0.3, 0.4, 0.5]))
    assert (result["auc"], result["advantage"], result["tpr_at_1pct_fpr"]) == (1.0, 1.0, 1.0)
    assert calibrated_attack(torch.zeros(2), torch.zeros(3), torch.ones(2), torch.zeros(3))["auc"] == 1.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: loss_threshold_attack(torch.zeros(0), torch.ones(3)), "at least one member"),
        (lambda: calibrated_attack(torch.ones(2), torch.ones(3), torch.ones(3), torch.ones(3)), "must match"),
        (lambda: per_sample_losses(nn.Linear(2, 2), torch.ones(3, 2), torch.zeros(2).long()), "3 inputs"),
    ],
)
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
