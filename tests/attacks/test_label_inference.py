"""Label inference from cut gradients (Li et al. 2022) on known answers: per-sample gradients of a small
server part's cross-entropy with respect to its input, with the true labels (the attacks find them) and
with noise labels (they find nothing), the binary norm attack on an imbalanced task, and the attacks'
figures on hand-made gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedge.attacks.label_inference import direction_attack, norm_attack, norm_scores

CLASSES, WIDTH, SAMPLES = 10, 16, 300


def cut_gradients(server: nn.Module, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """d CE / d z for each sample on its own (batch 1), as the server returns them down the cut: the
    server part treats samples independently, so row i of the summed loss's gradient is sample i's."""
    z = z.detach().requires_grad_(True)
    loss = nn.functional.cross_entropy(server(z), labels, reduction="sum")
    (grads,) = torch.autograd.grad(loss, z)
    return grads


def server_part(seed: int, classes: int) -> nn.Module:
    """A freshly initialised 2-layer server part (tanh: a smooth Jacobian, as a ReLU's per-sample masks
    would blur the directions the labels give)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, 32), nn.Tanh(), nn.Linear(32, classes))


@pytest.fixture
def smashed() -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A server part, random smashed data, its true labels and noise labels independent of them."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(SAMPLES, WIDTH, generator=g)
    labels = torch.randint(CLASSES, (SAMPLES,), generator=g)
    noise = torch.randint(CLASSES, (SAMPLES,), generator=g)
    return server_part(0, CLASSES), z, labels, noise


def test_direction_attack_finds_the_labels_behind_the_gradients(smashed):
    server, z, labels, _ = smashed
    result = direction_attack(
        cut_gradients(server, z, labels), labels, CLASSES, generator=torch.Generator().manual_seed(1)
    )
    assert result["auc"] > 0.9
    assert result["accuracy"] > 5 * result["chance"]
    assert (result["known"], result["unknown"], result["pairs"]) == (
        10,
        SAMPLES - 10,
        SAMPLES * (SAMPLES - 1) / 2,
    )


def test_direction_attack_finds_nothing_in_gradients_of_other_labels(smashed):
    server, z, labels, noise = smashed
    result = direction_attack(
        cut_gradients(server, z, noise), labels, CLASSES, generator=torch.Generator().manual_seed(1)
    )
    assert abs(result["auc"] - 0.5) < 0.05
    assert result["accuracy"] < 2 * result["chance"]


def test_norm_attack_scores_the_rare_positives_of_a_trained_model():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(400, WIDTH, generator=g)
    labels = (torch.rand(400, generator=g) < 0.1).long()
    z[labels == 1, 0] += 1.0  # a weak signal: the model learns mostly the 9:1 prior
    server = server_part(2, 2)
    optimizer = torch.optim.SGD(server.parameters(), lr=0.5)
    for _ in range(20):
        optimizer.zero_grad()
        nn.functional.cross_entropy(server(z), labels).backward()
        optimizer.step()
    grads = cut_gradients(server, z, labels)
    auc = norm_attack(grads, labels, 2)["auc"]
    assert auc > 0.8
    assert norm_attack(grads, 1 - labels, 2)["auc"] == pytest.approx(1 - auc)  # class 1 is the positive one


def test_norm_attack_on_many_classes_is_the_mean_one_vs_rest_auc():
    grads = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    result = norm_attack(grads, torch.tensor([0, 1, 2]), 4)
    assert norm_scores(grads).tolist() == [1.0, 2.0, 3.0]
    assert result["auc_per_class"][:3] == [0.0, 0.5, 1.0]
    assert math.isnan(result["auc_per_class"][3])
    assert result["auc"] == 0.5


def test_direction_attack_takes_zero_gradients_and_samples_pairs():
    g = torch.Generator().manual_seed(3)
    grads = torch.randn(40, 3, 4, generator=g)
    grads[::5] = 0.0
    labels = torch.arange(40) % 4
    result = direction_attack(grads, labels, 4, known_per_class=2, generator=g, max_pairs=100)
    assert all(math.isfinite(value) for value in result.values())
    assert (result["known"], result["unknown"], result["pairs"]) == (8, 32, 100)


@pytest.mark.parametrize(
    ("labels", "classes", "message"),
    [
        (torch.zeros(6, dtype=torch.long), 3, "fewer than 2 classes"),
        (torch.tensor([0, 1, 2, 0, 1, 5]), 3, r"labels must lie in \[0, 3\)"),
        (torch.tensor([0, 1]), 2, "2 labels for 6 gradients"),
        (torch.tensor([0, 1, 0, 1, 0, 1]), 1, "at least 2 classes"),
    ],
)
def test_bad_labels_are_refused(labels, classes, message):
    with pytest.raises(ValueError, match=message):
        norm_attack(torch.ones(6, 2), labels, classes)


def test_an_attacker_who_knows_every_label_has_nothing_to_infer():
    with pytest.raises(ValueError, match="every sample is known"):
        direction_attack(torch.eye(4), torch.tensor([0, 1, 0, 1]), 2, known_per_class=2)
