"""Lossy sparsification: each sender keeps a share of every tensor's entries and zeroes the rest.

``topk:<fraction>`` keeps the ``k = ceil(fraction * numel)`` entries of largest magnitude of each tensor and
pays for their positions exactly: the cheaper of a bitmap (one bit per entry) and a coordinate list
(``ceil(log2 numel)`` bits per kept entry), or plain dense when that is cheaper still, plus ``k`` values
at 32 bits. ``randk:<fraction>`` keeps ``k`` uniformly random entries; the positions come from a seed
both ends derive from the run seed (as cut dropout's masks do), so only the ``k`` values travel. Neither
rescales what it keeps: the receiver gets the sender's values on the kept entries and zeros elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedge.comm.codecs import Codec
from fedge.comm.sparse import sparse_bits
from fedge.rng import torch_rng
from fedge.tensors import Tensors

VALUE_BITS = 32


def kept(numel: int, fraction: float) -> int:
    """Entries a sender keeps of a tensor of ``numel`` values (at least one of a non-empty tensor)."""
    return min(numel, max(1 if numel else 0, math.ceil(fraction * numel - 1e-9)))


class Sparsifier(Codec):
    """Codec ``topk:<fraction>`` (``random=False``) or ``randk:<fraction>`` (``random=True``)."""

    def __init__(self, fraction: float, random: bool):
        if not 0.0 < fraction <= 1.0:
            raise ValueError("a sparsifier keeps a fraction in (0, 1] of the entries")
        self.fraction = fraction
        self.random = random
        self.stochastic = random
        self.name = f"{'randk' if random else 'topk'}:{fraction:g}"

    def _keep(self, row: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """One sender's tensor with all but its kept entries set to zero."""
        flat = row.reshape(-1)
        k = kept(flat.numel(), self.fraction)
        if k == flat.numel():
            return row.clone()
        if self.random:
            index = torch.randperm(flat.numel(), generator=generator, device=flat.device)[:k]
        else:
            index = torch.topk(flat.abs(), k, sorted=False).indices
        out = torch.zeros_like(flat)
        out[index] = flat[index]
        return out.reshape(row.shape)

    def encode(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Tensors:
        senders = next(iter(tensors.values())).shape[0] if stacked else 1
        seeds = seeds if seeds is not None else list(range(senders))
        device = next(iter(tensors.values())).device
        decoded: dict[str, list[torch.Tensor]] = {k: [] for k in tensors}
        for s, seed in enumerate(seeds):
            generator = torch_rng(seed, "randk", device=device) if self.random else None
            for key, t in tensors.items():
                decoded[key].append(self._keep(t[s] if stacked else t, generator))
        return {k: torch.stack(v) if stacked else v[0] for k, v in decoded.items()}

    def bits(self, values: np.ndarray, nonzeros: np.ndarray | None = None) -> np.ndarray:
        def one(numel: int) -> int:
            k = kept(numel, self.fraction)
            if self.random:
                return k * VALUE_BITS
            return sparse_bits(numel, k, VALUE_BITS)

        return np.vectorize(lambda n: one(int(n)), otypes=[np.int64])(values).sum(axis=1)
