"""AFIND+'s arithmetic as pure functions on ``[n, n]`` matrices (row i = client i's view of its peers).

Similarities ``sim[i, k]`` are cosines of feature proxies; ``mask[i, k]`` marks the entries a rule may use
(neighbours, a coreset, ...). Every function is vectorised over clients; nothing here draws random
numbers except :func:`gaussian_mechanism`, which takes its generator from the caller. Equation numbers
are those of Wang et al., "Smart Sampling" (AFIND+).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

EPS = 1e-8


def masked_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax over the entries of ``mask``; zero elsewhere and on rows with an empty mask."""
    masked = torch.where(mask, logits, torch.full_like(logits, -math.inf))
    top = masked.max(dim=1, keepdim=True).values
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    expd = torch.where(mask, torch.exp(masked - top), torch.zeros_like(logits))
    return expd / expd.sum(dim=1, keepdim=True).clamp_min(torch.finfo(logits.dtype).tiny)


def full_scores(sim: torch.Tensor, available: torch.Tensor, upsilon: float) -> torch.Tensor:
    """Eq. 8: ``p[i, k] = softmax_{k in B_i}(sim[i, k] / upsilon)``; rows sum to 1 over ``available``."""
    return masked_softmax(sim / upsilon, available)


def partial_scores(
    p: torch.Tensor, sim: torch.Tensor, refreshed: torch.Tensor, upsilon: float
) -> torch.Tensor:
    """Eq. 9: redistribute the mass the refreshed entries hold by their fresh similarities.

    ``M_i = sum_{k in R_i} p[i, k]``; refreshed entries become ``M_i * softmax_{R_i}(sim / upsilon)``, all
    other entries keep their old score, so every row keeps its sum (1).
    """
    mass = (p * refreshed).sum(dim=1, keepdim=True)
    return torch.where(refreshed, mass * masked_softmax(sim / upsilon, refreshed), p)


def adaptive_threshold(
    sim: torch.Tensor,
    members: torch.Tensor,
    tau: float,
    reduce: Literal["sum", "mean"] = "sum",
    normalize: Literal["sigmoid", "zscore"] = "sigmoid",
    direction: Literal["literal", "inverted"] = "literal",
) -> torch.Tensor:
    """Eqs. 10-13: ``theta_i = tau * (1 - sigmoid(h_i))``, ``h_i = -sum_{j in members} e ln e``.

    ``e = (sim + 1) / 2`` clipped to ``[1e-8, 1 - 1e-8]``. With the literal defaults ``theta`` lies in
    ``(0, tau / 2]`` and equals ``tau / 2`` for an empty member set. Flags (docs/decisions.md, "The
    threshold's direction"): ``reduce="mean"`` averages instead of summing; ``normalize="zscore"``
    standardises ``h`` over clients before the sigmoid; ``direction="inverted"`` uses ``tau * sigmoid(h)``,
    the prose's reading (more uncertainty, higher threshold).
    """
    e = ((sim + 1.0) / 2.0).clamp(EPS, 1.0 - EPS)
    terms = torch.where(members, -e * torch.log(e), torch.zeros_like(e))
    h = terms.sum(dim=1)
    if reduce == "mean":
        h = h / members.sum(dim=1).clamp_min(1).to(h.dtype)
    if normalize == "zscore":
        h = (h - h.mean()) / h.std(unbiased=False).clamp_min(EPS)
    confidence = 1.0 - torch.sigmoid(h)
    return tau * (confidence if direction == "literal" else 1.0 - confidence)


def smoothed_loss(pre: torch.Tensor, post: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 15: ``(1 - gamma) * post + gamma * pre`` (loss after and before local training)."""
    return (1.0 - gamma) * post + gamma * pre


def boltzmann_weights(losses: torch.Tensor, members: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. 16: ``varpi[i, j] = softmax_{j in members_i}(-losses[i, j] / temperature)``; rows sum to 1."""
    return masked_softmax(-losses / temperature, members)


def top_k(scores: torch.Tensor, allowed: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """Boolean ``[n, n]``: the ``k`` highest-scoring allowed entries of each row (fewer if fewer allowed).

    ``k`` is one count or a count per row. Ties go to the lower column index.
    """
    masked = torch.where(allowed, scores, torch.full_like(scores, -math.inf))
    order = torch.argsort(-masked, dim=1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(scores.shape[1], device=scores.device).expand_as(order))
    k = torch.as_tensor(k, device=scores.device).reshape(-1, 1)
    return allowed & (ranks < k)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of ``[R, D]`` tensors (0 where a vector is zero), as float64.

    Computed in the inputs' precision (one pass, no float64 copies of the proxies), then widened.
    """
    dots = torch.linalg.vecdot(a, b, dim=1).double()
    norms = torch.linalg.vector_norm(a, dim=1).double() * torch.linalg.vector_norm(b, dim=1).double()
    return (dots / norms.clamp_min(1e-30)).clamp(-1.0, 1.0)


def clip_rows(values: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale each row of ``[B, D]`` to L2 norm at most ``bound`` (per-example clipping of DP-SGD)."""
    norms = values.norm(dim=1, keepdim=True)
    return values * (bound / norms.clamp_min(bound))


def gaussian_mechanism(
    summed: torch.Tensor,
    count: torch.Tensor,
    clip: float,
    sigma: float,
    generator: torch.Generator,
    offset: int = 0,
    total: int | None = None,
) -> torch.Tensor:
    """AFIND+ Table 4's Gaussian mechanism: ``(sum of clipped values + N(0, sigma^2 clip^2 I)) / L`` per row.

    ``summed`` is ``[R, D]`` (each row a sum of per-example values already clipped to ``clip``), ``count``
    the batch size ``L`` of each row. The noise added to each mean therefore has std ``sigma*clip/L``.
    With ``total``, ``summed`` holds only rows ``offset .. offset + R`` of a ``total``-row matrix (one
    process's rows): the whole matrix's noise is drawn and those rows taken, so each row gets the same
    noise as in one call.
    """
    total = len(summed) if total is None else total
    noise = torch.randn((total, *summed.shape[1:]), generator=generator, dtype=summed.dtype, device="cpu")
    noise = noise[offset : offset + len(summed)].to(summed.device) * (sigma * clip)
    return (summed + noise) / count.reshape(-1, 1).to(summed.dtype).clamp_min(1.0)


def selection_metrics(selected: torch.Tensor) -> dict[str, float]:
    """Per-round counts of selected neighbours (boolean ``[n, n]``): mean, min and max over clients."""
    counts = selected.sum(dim=1).double()
    return {
        "selected_mean": float(counts.mean()),
        "selected_min": float(counts.min()),
        "selected_max": float(counts.max()),
    }
