"""The sample distance correlation (Székely, Rizzo & Bakirov, "Measuring and testing dependence by
correlation of distances", 2007) of two batches, as a differentiable loss term.

NoPeek (Vepakomma et al., 2020) adds ``alpha * DCor(X, Z)`` to a split client's loss so that the smashed
data ``Z`` it sends carries less of its raw inputs ``X``. Each batch row is one sample, flattened. The
batches of a round's clients are padded to one width, so rows carry a weight: a row of weight 0 takes no
part (weighted double-centering, no data-dependent Python control flow), and the function runs alike on
one client's real rows and, under ``vmap``, on the padded rows of many.
"""

from __future__ import annotations

import torch

EPS = 1e-12
"""Keeps the ratio's denominator and the final square root away from 0 (a batch of one sample, or
smashed data that does not vary, has no distance variance)."""


def distances(v: torch.Tensor) -> torch.Tensor:
    """The ``[B, B]`` Euclidean distances between the flattened rows of ``v``: from the Gram matrix (no
    ``[B, B, D]`` difference tensor), zero on the diagonal, and with a zero gradient where a distance is 0
    (a plain square root's is infinite there)."""
    flat = v.flatten(1)
    norms = (flat * flat).sum(dim=1)
    off_diagonal = 1.0 - torch.eye(flat.shape[0], dtype=flat.dtype, device=flat.device)
    squared = (norms[:, None] + norms[None, :] - 2.0 * flat @ flat.T).clamp_min(0.0) * off_diagonal
    positive = squared > 0
    return torch.where(positive, torch.where(positive, squared, 1.0).sqrt(), 0.0)


def centred(d: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``d`` double-centred under the row probabilities ``p``: ``d_ij - d_i. - d_.j + d_..``."""
    row = d @ p
    return d - row[:, None] - row[None, :] + p @ row


def distance_correlation(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The sample distance correlation of the rows of ``x`` and ``z`` (``[B, ...]`` each) where ``weight``
    (``[B]``) is positive, in [0, 1]: 0 for independent samples (in the limit), 1 when ``z`` is a
    similarity transform of ``x``. ``x`` enters as a constant (no gradient)."""
    p = weight / weight.sum().clamp_min(torch.finfo(weight.dtype).tiny)
    p = p.to(z.dtype)
    a = centred(distances(x.detach().to(z.dtype)), p)
    b = centred(distances(z), p)

    def covariance(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return p @ (u * v) @ p

    ratio = covariance(a, b) / (covariance(a, a) * covariance(b, b) + EPS).sqrt()
    return (ratio.clamp_min(0.0) + EPS).sqrt()
