"""The sample distance correlation of NoPeek's loss term: a plain reference on the real rows, padding
rows that do not count, its known values, its gradient and its vmap over clients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import grad, vmap

from fedge.engine.distance_correlation import distance_correlation


def reference(x: np.ndarray, z: np.ndarray) -> float:
    """Székely et al.'s V-statistic, written out: double-centred distance matrices, dCov^2 = mean(A B),
    dCor = sqrt(dCov^2(x, z) / sqrt(dVar^2(x) dVar^2(z)))."""
    x, z = x.reshape(len(x), -1), z.reshape(len(z), -1)

    def centred(v: np.ndarray) -> np.ndarray:
        d = np.sqrt(((v[:, None, :] - v[None, :, :]) ** 2).sum(axis=-1))
        return d - d.mean(axis=0)[None, :] - d.mean(axis=1)[:, None] + d.mean()

    a, b = centred(x), centred(z)
    return float(np.sqrt((a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean())))


def dependent(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[rows, 2, 3, 3]`` and a noisy nonlinear function of them ``[rows, 5]`` (float64)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2, 3, 3, generator=g, dtype=torch.float64)
    mix = torch.randn(18, 5, generator=g, dtype=torch.float64)
    z = torch.tanh(x.flatten(1) @ mix) + 0.5 * torch.randn(rows, 5, generator=g, dtype=torch.float64)
    return x, z


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_it_equals_the_reference_on_random_data(seed):
    x, z = dependent(13, seed)
    value = distance_correlation(x, z, torch.ones(13, dtype=torch.float64))
    assert float(value) == pytest.approx(reference(x.numpy(), z.numpy()), abs=1e-6)


def test_padding_rows_do_not_count_and_get_no_gradient():
    x, z = dependent(16, 3)
    weight = torch.ones(16, dtype=torch.float64)
    weight[11:] = 0.0
    x[11:], z[11:] = 0.0, 0.0  # padding as a plan pads: the same zero row, several times
    z = z.requires_grad_(True)
    value = distance_correlation(x, z, weight)
    expected = reference(x[:11].numpy(), z[:11].detach().numpy())
    assert float(value.detach()) == pytest.approx(expected, abs=1e-6)
    (gradient,) = torch.autograd.grad(value, z)
    assert torch.isfinite(gradient).all() and float(gradient[:11].abs().max()) > 0
    assert float(gradient[11:].abs().max()) == 0.0


def test_known_values():
    x, _ = dependent(20, 4)
    ones = torch.ones(20, dtype=torch.float64)
    assert float(distance_correlation(x, x, ones)) == pytest.approx(1.0, abs=1e-6)
    assert float(distance_correlation(x, -3.0 * x + 2.0, ones)) == pytest.approx(1.0, abs=1e-6)
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(2000, 4, generator=g), torch.randn(2000, 4, generator=g)
    assert float(distance_correlation(a, b, torch.ones(2000))) < 0.1  # independent: O(n^-1/2)
    assert float(distance_correlation(a, b[:, :1] + a[:, :1], torch.ones(2000))) > 0.3


def test_a_batch_without_spread_gives_a_finite_gradient():
    """One real sample, or smashed data that does not vary: no distance variance, no NaN."""
    x, z = dependent(4, 6)
    for weight, smashed in ((torch.tensor([1.0, 0, 0, 0]), z), (torch.ones(4), torch.ones_like(z))):
        leaf = smashed.clone().requires_grad_(True)
        value = distance_correlation(x, leaf, weight.to(z))
        (gradient,) = torch.autograd.grad(value, leaf)
        assert float(value.detach()) < 1e-5 and torch.isfinite(gradient).all()


def test_under_vmap_each_client_gets_its_own_rows_gradient():
    """Stacked clients with different real-row counts (the batched executor) against each client's
    real rows alone (the sequential one)."""
    clients = [dependent(9, seed) for seed in (7, 8, 9)]
    counts = [9, 6, 3]
    x = torch.stack([c[0] for c in clients])
    z = torch.stack([c[1] for c in clients])
    weight = (torch.arange(9)[None, :] < torch.tensor(counts)[:, None]).to(z)
    stacked = vmap(grad(distance_correlation, argnums=1))(x, z, weight)
    for r, n in enumerate(counts):
        alone = grad(distance_correlation, argnums=1)(x[r, :n], z[r, :n], torch.ones(n, dtype=z.dtype))
        assert torch.allclose(stacked[r, :n], alone, atol=1e-12)
        assert bool((stacked[r, n:] == 0).all())
