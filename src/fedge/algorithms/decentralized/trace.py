"""AFIND+'s selection trace: one round's neighbour selection summarised over clients, for metrics.jsonl
and the report (why a client keeps the neighbours it keeps)."""

from __future__ import annotations

import torch


def selection_trace(
    theta: torch.Tensor,
    chosen: torch.Tensor,
    available: torch.Tensor,
    scores: torch.Tensor,
    sim: torch.Tensor,
    mixing: torch.Tensor | None,
) -> dict[str, float]:
    """The threshold each client used (``theta_*``, from ``theta`` ``[n]``); the best helpfulness score
    each had (``score_best_mean``: a neighbour enters only if its score reaches the threshold) and how many
    could pass at most (``passing_bound_mean``: the scores sum to 1, so at most ``floor(1 / theta)``); the
    last proxy similarity to the ``chosen`` and the other ``available`` neighbours (``sim_selected_mean``,
    ``sim_others_mean``, absent without such a pair); the ``mixing`` weight on oneself and on the
    heaviest peer (``weight_self_mean``, ``weight_peer_max_mean``, when the round mixed)."""
    best = torch.where(available, scores, torch.zeros_like(scores)).max(dim=1).values
    figures = {
        "theta_mean": float(theta.mean()),
        "theta_min": float(theta.min()),
        "theta_max": float(theta.max()),
        "score_best_mean": float(best.mean()),
        "passing_bound_mean": float(torch.floor(1.0 / theta.clamp_min(1e-12)).mean()),
    }
    for key, pairs in (("sim_selected_mean", chosen), ("sim_others_mean", available & ~chosen)):
        if bool(pairs.any()):  # left out of a round with no such pair
            figures[key] = float(sim[pairs].mean())
    if mixing is not None:
        own = torch.eye(len(mixing), dtype=torch.bool, device=mixing.device)
        figures["weight_self_mean"] = float(mixing.diagonal().mean())
        figures["weight_peer_max_mean"] = float(mixing.masked_fill(own, 0.0).max(dim=1).values.mean())
    return figures
