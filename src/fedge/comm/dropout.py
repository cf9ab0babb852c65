"""Inverted activation dropout at the cut with a mask both ends derive from a shared seed.

Each entry of the cut-layer output is kept with probability ``1 - p`` and scaled by ``1 / (1 - p)``, so
``E[dropout(a)] = a`` (lightweight FedSL Eq. 3, Corollary 1). Client and server draw the mask from the same
stream ``(seed, "cut-dropout", round, client, step)``, so only kept entries are sent and no mask bits travel
(docs/decisions.md, "Element-wise cut dropout with a shared mask"); dropped entries also get zero gradient, so
the downlink gradient has the same sparsity. ``p = 0`` is the identity, bit for bit.
"""

from __future__ import annotations

import torch


def dropout_mask(shape: tuple[int, ...], p: float, generator: torch.Generator, device=None) -> torch.Tensor:
    """A 0/1 float mask keeping each entry with probability ``1 - p``."""
    return (torch.rand(shape, generator=generator, device=device) >= p).to(torch.float32)


def apply_dropout(activations: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """``activations * mask / (1 - p)``; autograd then scales the returned gradient the same way."""
    if p == 0.0:
        return activations
    return activations * mask.to(activations.dtype) / (1.0 - p)
