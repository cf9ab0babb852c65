"""The lossy and sparse codecs of lightweight FedSL: quantizer (Eqs. 11-12), cut dropout (Eq. 3), sparse."""

from __future__ import annotations

import math

import pytest
import torch

from fedge.comm import (
    Ledger,
    Network,
    apply_dropout,
    dropout_mask,
    get_codec,
    sparse_bits,
    stochastic_quantize,
    variance_bound,
)


def vector(seed: int = 0, size: int = 200) -> torch.Tensor:
    g = torch.randn(size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    g[::7] = 0.0  # pruned entries
    return g


def test_quantizer_lies_on_the_signed_grid_and_keeps_zeros():
    g, bits = vector(), 3
    q = stochastic_quantize(g, bits, torch.Generator().manual_seed(1))
    low, high = g.abs().min(), g.abs().max()
    levels = (q.abs() - low) / ((high - low) / (2**bits - 1))
    assert torch.allclose(levels, levels.round(), atol=1e-9)
    assert len(torch.unique(q.abs())) <= 2**bits
    assert torch.equal(q[g == 0], g[g == 0]) and bool((torch.sign(q) * torch.sign(g) >= 0).all())


def test_quantizer_is_unbiased_with_the_papers_variance_bound():
    g, bits, draws = vector(size=50), 2, 10_000
    gen = torch.Generator().manual_seed(2)
    samples = torch.stack([stochastic_quantize(g, bits, gen) for _ in range(draws)])
    std_error = samples.std(dim=0) / math.sqrt(draws)
    assert bool(((samples.mean(dim=0) - g).abs() <= 4 * std_error + 1e-12).all())
    mean_sq_error = float(((samples - g) ** 2).sum(dim=1).mean())
    assert mean_sq_error <= variance_bound(g, bits)


def test_quantizer_error_shrinks_about_fourfold_per_bit():
    g = vector(size=1000)
    gen = torch.Generator().manual_seed(3)
    errors = [
        float(torch.stack([(stochastic_quantize(g, b, gen) - g).pow(2).sum() for _ in range(200)]).mean())
        for b in (4, 5, 6)
    ]
    assert 3.0 < errors[0] / errors[1] < 5.0 and 3.0 < errors[1] / errors[2] < 5.0


def test_quantizer_degenerate_vector_is_returned_unchanged():
    g = torch.full((5,), -0.5)
    assert torch.equal(stochastic_quantize(g, 4), g)


def test_quantizer_codec_counts_sign_level_and_range_bits():
    stacked = {"w": torch.randn(3, 4, 5), "b": torch.randn(3, 5)}
    encoded = get_codec("q8").transmit(stacked, stacked=True, seeds=[1, 2, 3])
    assert encoded.bits.tolist() == [25 * (1 + 8) + 64] * 3
    again = get_codec("q8").transmit(stacked, stacked=True, seeds=[1, 2, 3])
    assert torch.equal(encoded.payload["w"], again.payload["w"])
    assert not torch.equal(encoded.payload["w"][0], stacked["w"][0])


def test_dropout_is_unbiased_and_sends_kept_entries_only():
    a, p = torch.linspace(-1, 1, 40), 0.3
    gen = torch.Generator().manual_seed(4)
    masks = torch.stack([dropout_mask(a.shape, p, gen) for _ in range(10_000)])
    dropped = apply_dropout(a.expand(10_000, -1), masks, p)
    std_error = dropped.std(dim=0) / 100
    assert bool(((dropped.mean(dim=0) - a).abs() <= 3.5 * std_error + 1e-9).all())
    assert abs(float(masks.mean()) - (1 - p)) < 0.01
    link = Network(Ledger()).link("fp32")
    sent = link.send(
        1, "client:0", "server", "smashed_up", {"z": dropped[:1]}, stacked=True, entry_mask=masks[:1]
    )
    assert sent.bits.tolist() == [32 * int(masks[0].sum())]


def test_dropout_p0_is_identity_and_backward_scales_by_the_mask():
    a = torch.randn(6, requires_grad=True)
    assert apply_dropout(a, torch.zeros(6), 0.0) is a
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    apply_dropout(a, mask, 0.5).sum().backward()
    assert torch.equal(a.grad, mask / 0.5)


@pytest.mark.parametrize(
    ("numel", "nonzero", "expected"),
    [(1000, 1000, 32_000), (1000, 500, 1000 + 500 * 32), (1000, 10, 10 * (32 + 10)), (1000, 0, 0)],
)
def test_sparse_bits_pick_the_cheapest_layout(numel, nonzero, expected):
    assert sparse_bits(numel, nonzero) == expected


def test_sparse_codec_is_lossless_and_counts_per_sender():
    w = torch.zeros(2, 100)
    w[0, :3] = 1.0
    encoded = get_codec("sparse").transmit({"w": w}, stacked=True)
    assert encoded.bits.tolist() == [3 * (32 + 7), 0] and torch.equal(encoded.payload["w"], w)
