"""Sparse encodings: the cost of sending tensors with many exact zeros (pruned models, dropped
activations).

The sender picks the cheaper of two standard layouts per payload: a bitmap (one bit per entry, then
the non-zero values) or coordinate lists (``ceil(log2 numel)`` index bits plus the value per non-zero).
Dense is used when neither is cheaper. The values travel at ``value_bits`` each (32 for fp32).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedge.comm.codecs import Codec, Encoded, Tensors


def sparse_bits(numel: int, nonzero: int, value_bits: int = 32) -> int:
    """Bits of the cheapest of dense, bitmap and coordinate-list encodings of one tensor."""
    dense = numel * value_bits
    bitmap = numel + nonzero * value_bits
    coordinates = nonzero * (value_bits + max(1, math.ceil(math.log2(max(numel, 2)))))
    return min(dense, bitmap, coordinates)


class SparseCodec(Codec):
    """Codec ``sparse``: lossless, each tensor costs its cheapest sparse (or dense) layout at fp32."""

    name = "sparse"

    def __init__(self, value_bits: int = 32):
        self.value_bits = value_bits

    def transmit(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Encoded:
        senders = next(iter(tensors.values())).shape[0] if stacked else 1
        bits = np.zeros(senders, dtype=np.int64)
        for value in tensors.values():
            rows = value.reshape(senders, -1) if stacked else value.reshape(1, -1)
            nonzero = torch.count_nonzero(rows, dim=1).cpu().numpy()
            bits += np.array([sparse_bits(rows.shape[1], int(nz), self.value_bits) for nz in nonzero])
        return Encoded(dict(tensors), bits)
