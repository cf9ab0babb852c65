"""The q-bit unbiased stochastic quantizer of lightweight FedSL (Eqs. 11-12, Assumption 6).

Magnitudes are placed on ``2^q`` evenly spaced levels between the smallest and largest magnitude of
the vector and rounded up or down at random with the probabilities that make the result unbiased:
``E[Q(g)] = g`` and ``E||Q(g) - g||^2 <= M (g_max - g_min)^2 / (4 (2^q - 1)^2)``. Signs are kept and
zeros stay zero, so pruned weights are not revived. Cost: a sign bit and ``q`` level bits per entry plus
the two 32-bit floats ``g_min, g_max``. Granularity: the whole vector (the paper's, our default) or
each tensor separately.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from fedge.comm.codecs import Codec
from fedge.rng import torch_rng
from fedge.tensors import Tensors

RANGE_BITS = 64  # g_min and g_max as two float32 values


def stochastic_quantize(g: torch.Tensor, bits: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``Q(g)`` over the whole tensor ``g`` with ``2^bits`` magnitude levels (unbiased, stochastic)."""
    magnitude = g.abs()
    low, high = magnitude.min(), magnitude.max()
    if bool(high == low):
        return g.clone()
    step = (high - low) / (2**bits - 1)
    index = torch.floor((magnitude - low) / step).clamp(0, 2**bits - 2)
    lower = low + index * step
    p_up = ((magnitude - lower) / step).clamp(0.0, 1.0)
    uniform = torch.rand(g.shape, generator=generator, device=g.device, dtype=g.dtype)
    return torch.sign(g) * torch.where(uniform < p_up, lower + step, lower)


def variance_bound(g: torch.Tensor, bits: int) -> float:
    """The paper's bound on ``E||Q(g) - g||^2`` (Assumption 6): ``M (g_max - g_min)^2 / (4 (2^q - 1)^2)``."""
    magnitude = g.abs()
    spread = float(magnitude.max() - magnitude.min())
    return g.numel() * spread**2 / (4 * (2**bits - 1) ** 2)


def quantized_bits(numel: int, bits: int, ranges: int = 1) -> int:
    """Bits on the link for ``numel`` entries quantized with ``ranges`` (g_min, g_max) pairs."""
    return numel * (1 + bits) + ranges * RANGE_BITS


def quantize_dict(
    tensors: Tensors, bits: int, generator: torch.Generator, granularity: Literal["vector", "tensor"]
) -> Tensors:
    """Quantize a dict of tensors as one flattened vector or tensor by tensor."""
    if granularity == "tensor":
        return {k: stochastic_quantize(v, bits, generator) for k, v in tensors.items()}
    flat = torch.cat([v.reshape(-1) for v in tensors.values()])
    quantized = stochastic_quantize(flat, bits, generator)
    out, start = {}, 0
    for key, value in tensors.items():
        out[key] = quantized[start : start + value.numel()].reshape(value.shape)
        start += value.numel()
    return out


class StochasticQuantizer(Codec):
    """Codec ``q<bits>``: each sender's payload quantized with its own seeded random stream."""

    stochastic = True

    def __init__(self, bits: int, granularity: Literal["vector", "tensor"] = "vector"):
        if not 1 <= bits <= 31:
            raise ValueError("quantizer bits must be in 1..31")
        self.name = f"q{bits}"
        self.bits_per_value = bits
        self.granularity = granularity

    def encode(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Tensors:
        senders = next(iter(tensors.values())).shape[0] if stacked else 1
        seeds = seeds if seeds is not None else list(range(senders))
        rows = [{k: v[i] for k, v in tensors.items()} for i in range(senders)] if stacked else [tensors]
        device = next(iter(tensors.values())).device
        decoded = [
            quantize_dict(
                row, self.bits_per_value, torch_rng(seed, "quantizer", device=device), self.granularity
            )
            for row, seed in zip(rows, seeds, strict=True)
        ]
        return {k: torch.stack([d[k] for d in decoded]) for k in tensors} if stacked else decoded[0]

    def bits(self, values: np.ndarray, nonzeros: np.ndarray | None = None) -> np.ndarray:
        ranges = 1 if self.granularity == "vector" else values.shape[1]
        return values.sum(axis=1) * (1 + self.bits_per_value) + ranges * RANGE_BITS
