"""The min-max and min-sum model poisoning attacks (Shejwalkar and Houmansadr, "Manipulating the
Byzantine: optimizing model poisoning attacks and defenses for federated learning", NDSS 2021).

Both are the paper's aggregation-agnostic attacks: the malicious change is ``mean(D) + gamma p`` over the
honest changes ``D`` of the round, with the perturbation ``p`` one of the paper's three (``std``: the
inverse coordinate-wise standard deviation ``-std(D)``; ``unit``: the inverse unit vector of the mean,
``-mean(D) / ||mean(D)||``; ``sign``: the inverse sign ``-sign(mean(D))``), and ``gamma`` the largest the
paper's binary search (its Algorithm 1) finds such that the malicious change stays as close to the
honest ones as they are to each other:

- min-max: ``max_i ||m - D_i||^2 <= max_{i,j} ||D_i - D_j||^2``;
- min-sum: ``sum_i ||m - D_i||^2 <= max_i sum_j ||D_i - D_j||^2``.

One vector per row over every floating tensor together. With ``a_i = mean(D) - D_i``, the distance
``||m - D_i||^2 = ||a_i||^2 + 2 gamma a_i . p + gamma^2 ||p||^2`` needs only the Gram matrix of the
``a_i`` and the products ``a_i . p``, accumulated tensor by tensor in float64, so the search tests each
``gamma`` on ``h`` numbers and never revisits the rows.
"""

from __future__ import annotations

from typing import Any

import torch

from fedge.tensors import Tensors

DEFAULTS: dict[str, Any] = {"perturbation": "std", "gamma_init": 10.0, "tolerance": 1e-5}
"""The options' defaults: the paper's ``gamma_init`` 10 and threshold 1e-5, and ``-std`` as its
perturbation."""


def perturbation(kind: str, honest: torch.Tensor) -> torch.Tensor:
    """One tensor's perturbation from its honest changes ``honest`` ``[h, ...]`` (``unit``: the mean,
    negated, not yet divided by the norm of the whole mean, which spans every tensor)."""
    mean = honest.mean(dim=0)
    if kind == "std":
        return -honest.std(dim=0, correction=1 if len(honest) > 1 else 0)
    if kind == "sign":
        return -torch.sign(mean)
    return -mean


def search(holds: Any, gamma_init: float, tolerance: float) -> float:
    """The paper's binary search: from ``gamma_init`` with step ``gamma_init``, each test moves
    ``gamma`` up (``holds(gamma)``: it is the last success) or down by half the step, and the step halves,
    until the last success and the next ``gamma`` are within ``tolerance``; the last success (0: none)."""
    gamma, step, success = gamma_init, gamma_init, 0.0
    while abs(success - gamma) > tolerance:
        if holds(gamma):
            success, gamma = gamma, gamma + step / 2
        else:
            gamma = gamma - step / 2
        step /= 2
    return success


def crafted(attack: str, options: dict[str, Any], honest: Tensors) -> tuple[Tensors, float]:
    """The malicious change of ``attack`` (``min_max`` or ``min_sum``) for every floating tensor, from the
    honest changes ``honest`` (``[h, ...]`` each), and the ``gamma`` found; computed in float64, the
    change returned in each tensor's dtype."""
    kind = str(options.get("perturbation", DEFAULTS["perturbation"]))
    h = len(next(iter(honest.values())))
    gram = torch.zeros(h, h, dtype=torch.float64)
    along = torch.zeros(h, dtype=torch.float64)  # a_i . p
    norm2, mean2 = 0.0, 0.0  # ||p||^2, ||mean||^2
    means, directions = {}, {}
    for name, changes in honest.items():
        wide = changes.double()
        mean, p = wide.mean(dim=0), perturbation(kind, wide)
        a = (mean - wide).reshape(h, -1).cpu()
        flat_p = p.reshape(-1).cpu()
        gram += a @ a.T
        along += a @ flat_p
        norm2 += float(flat_p @ flat_p)
        mean2 += float(mean.pow(2).sum())
        means[name], directions[name] = mean, p
    scale = 1.0
    if kind == "unit":  # p = -mean / ||mean|| over every tensor
        scale = 1.0 / mean2**0.5 if mean2 > 0 else 0.0
        along, norm2 = along * scale, norm2 * scale**2
    own = gram.diagonal()  # ||a_i||^2
    pairwise = (own[:, None] + own[None, :] - 2 * gram).clamp_min(0)  # ||D_i - D_j||^2
    if attack == "min_max":
        bound = float(pairwise.max())

        def holds(gamma: float) -> bool:
            return float((own + 2 * gamma * along + gamma**2 * norm2).max()) <= bound

    else:
        bound = float(pairwise.sum(dim=1).max())

        def holds(gamma: float) -> bool:
            return float((own + 2 * gamma * along + gamma**2 * norm2).sum()) <= bound

    gamma = search(
        holds,
        float(options.get("gamma_init", DEFAULTS["gamma_init"])),
        float(options.get("tolerance", DEFAULTS["tolerance"])),
    )
    change = {n: (means[n] + (gamma * scale) * directions[n]).to(honest[n].dtype) for n in honest}
    return change, gamma
