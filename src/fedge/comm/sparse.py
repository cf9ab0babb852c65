"""Sparse encodings: the cost of sending tensors with many exact zeros (pruned models, dropped
activations).

Per tensor, the sender picks the cheapest of its codec's layouts: dense, a bitmap (one bit per entry,
then the non-zero values) or coordinate lists (``ceil(log2 numel)`` index bits plus the value per
non-zero). Codec ``sparse`` knows all three; codec ``bitmap`` only dense and bitmap (masked models whose
masks travel as bitmaps). The values travel at ``value_bits`` each (32 for fp32).
"""

from __future__ import annotations

import math

import numpy as np

from fedge.comm.codecs import Codec
from fedge.tensors import Tensors

LAYOUTS = ("dense", "bitmap", "coordinates")


def sparse_bits(numel: int, nonzero: int, value_bits: int = 32, layouts: tuple[str, ...] = LAYOUTS) -> int:
    """Bits of the cheapest of the ``layouts`` (dense, bitmap, coordinate list) of one tensor."""
    cost = {
        "dense": numel * value_bits,
        "bitmap": numel + nonzero * value_bits,
        "coordinates": nonzero * (value_bits + max(1, math.ceil(math.log2(max(numel, 2))))),
    }
    return min(cost[layout] for layout in layouts)


class SparseCodec(Codec):
    """Lossless: each tensor costs its cheapest layout among ``layouts``, values at ``value_bits``."""

    counts_nonzeros = True
    lossless = True

    def __init__(self, name: str = "sparse", layouts: tuple[str, ...] = LAYOUTS, value_bits: int = 32):
        self.name = name
        self.layouts = layouts
        self.value_bits = value_bits

    def encode(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Tensors:
        return dict(tensors)

    def bits(self, values: np.ndarray, nonzeros: np.ndarray | None = None) -> np.ndarray:
        if nonzeros is None:
            raise ValueError("the sparse codec counts non-zero values")
        per_tensor = np.vectorize(
            lambda n, nz: sparse_bits(int(n), int(nz), self.value_bits), otypes=[np.int64]
        )
        return per_tensor(values, nonzeros).sum(axis=1)
