"""Estimators of the constants the bounds need, from a model and federated data (the papers assume them).

- L: the largest |eigenvalue| of each client's Hessian by power iteration on exact Hessian-vector products
  (reverse-over-reverse autodiff, not finite differences), maximised over clients (the SplitFed theory paper
  states its Assumption 1 for the global functions but uses it per client in its proofs).
- sigma_L^2(B): the variance of a size-B mini-batch gradient around the client's full gradient, computed
  exactly from per-sample gradients for batches drawn without replacement (what the batch plans do):
  ``S_i^2 / B * (n_i - B) / (n_i - 1)``, S_i^2 the population variance of client i's per-sample gradients;
  maximised over clients. It scales ~1/B, so it must be estimated at the training batch size.
- sigma_G^2: ``max_i ||grad F_i - grad F||^2`` (Assumption 3 is a max over clients); the mean over clients
  is reported too.
- The objective value, from which ``delta_F = F(x^0) - F_inf`` with ``F_inf = 0`` for cross-entropy (a
  conservative lower bound).
All are taken at one parameter point; evaluate at several checkpoints and combine with
:func:`worst_case` (the max over checkpoints).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch.func import grad, vmap

from fedge.empirical.objective import FederatedObjective, Tensors, eval_mode, flat
from fedge.rng import torch_rng


@dataclass(frozen=True)
class Constants:
    """Estimated constants at one point (or the worst case over several, see :func:`worst_case`)."""

    L: float
    sigma_L2: float
    sigma_G2: float
    sigma_G2_mean: float
    value: float
    grad_sq: float
    batch_size: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _dot(a: Tensors, b: Tensors) -> torch.Tensor:
    return sum((a[k].double() * b[k].double()).sum() for k in a)


def hessian_vector(objective: FederatedObjective, params: Tensors, client: int, v: Tensors) -> Tensors:
    """``H_i v``: client ``client``'s full-batch Hessian of ``F_i`` at ``params`` times ``v``."""
    n = len(objective.clients[client])
    out = {k: torch.zeros_like(p) for k, p in params.items()}
    with eval_mode(objective.modules):
        for x, y in objective.chunks(client):

            def chunk_sum(p: Tensors, x=x, y=y) -> torch.Tensor:
                return objective.loss(p, x, y).sum()

            hv = grad(lambda p, f=chunk_sum: _dot(grad(f)(p), v))(params)
            for k in out:
                out[k] += hv[k]
    return {k: t / n for k, t in out.items()}


def client_smoothness(
    objective: FederatedObjective, params: Tensors, client: int, *, iters: int = 30, seed: int = 0, tol=1e-3
) -> float:
    """Largest |eigenvalue| of client ``client``'s Hessian by power iteration from a seeded random start."""
    gen = torch_rng(seed, "theory-power", client, device=next(iter(params.values())).device)
    v = {k: torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype) for k, p in params.items()}
    norm = math.sqrt(float(_dot(v, v)))
    v = {k: t / norm for k, t in v.items()}
    estimate = 0.0
    for _ in range(iters):
        hv = hessian_vector(objective, params, client, v)
        norm = math.sqrt(float(_dot(hv, hv)))
        if norm == 0.0:
            return 0.0
        converged = abs(norm - estimate) <= tol * norm
        estimate = norm
        v = {k: t / norm for k, t in hv.items()}
        if converged:
            break
    return estimate


def smoothness(objective: FederatedObjective, params: Tensors, *, iters: int = 30, seed: int = 0) -> float:
    """``L`` = max over clients of their Hessian's spectral norm at ``params``."""
    return max(
        client_smoothness(objective, params, i, iters=iters, seed=seed) for i in range(objective.num_clients)
    )


def client_sample_variance(objective: FederatedObjective, params: Tensors, client: int) -> float:
    """Population variance ``S_i^2 = (1/n) sum_j ||g_j - gbar||^2`` of client i's per-sample gradients."""
    n = len(objective.clients[client])

    def one(p: Tensors, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return objective.loss(p, x[None], y[None])[0]

    per_sample = vmap(grad(one), in_dims=(None, 0, 0))
    size = max(1, min(objective.chunk, 2**24 // max(1, sum(p.numel() for p in params.values()))))
    sq_sum = 0.0
    mean = {k: torch.zeros_like(p, dtype=torch.float64) for k, p in params.items()}
    with eval_mode(objective.modules):
        for x, y in objective.chunks(client, size):
            g = per_sample(params, x, y)
            sq_sum += float(sum((t.double() ** 2).sum() for t in g.values()))
            for k in mean:
                mean[k] += g[k].double().sum(dim=0)
    mean_sq = float(sum((t**2).sum() for t in mean.values())) / n**2
    return max(sq_sum / n - mean_sq, 0.0)


def local_variance(objective: FederatedObjective, params: Tensors, batch_size: int) -> float:
    """``sigma_L^2(B)``: max over clients of the variance of a size-B mini-batch gradient (without
    replacement; 0 when a client's whole set fits in one batch)."""
    worst = 0.0
    for i in range(objective.num_clients):
        n = len(objective.clients[i])
        if n <= batch_size:
            continue
        s2 = client_sample_variance(objective, params, i)
        worst = max(worst, s2 / batch_size * (n - batch_size) / (n - 1))
    return worst


def heterogeneity(objective: FederatedObjective, params: Tensors) -> tuple[float, float, float, float]:
    """``(max_i, mean_i)`` of ``||grad F_i - grad F||^2``, then ``F`` and ``||grad F||^2`` at ``params``."""
    values, grads = objective.client_gradients(params)
    mean = grads.mean(dim=0)
    spread = ((grads - mean) ** 2).sum(dim=1)
    return float(spread.max()), float(spread.mean()), float(values.mean()), float((mean**2).sum())


def estimate_constants(
    objective: FederatedObjective, params: Tensors, *, batch_size: int, power_iters: int = 30, seed: int = 0
) -> Constants:
    """L, sigma_L^2(batch_size), sigma_G^2 (max and mean), F and ||grad F||^2 at ``params``."""
    params = {k: v.detach() for k, v in params.items()}
    g_max, g_mean, value, grad_sq = heterogeneity(objective, params)
    return Constants(
        L=smoothness(objective, params, iters=power_iters, seed=seed),
        sigma_L2=local_variance(objective, params, batch_size),
        sigma_G2=g_max,
        sigma_G2_mean=g_mean,
        value=value,
        grad_sq=grad_sq,
        batch_size=batch_size,
    )


def worst_case(points: list[Constants]) -> Constants:
    """The max of each constant over several checkpoints; ``value`` / ``grad_sq`` of the first point
    (the initial model, which defines delta_F)."""
    return Constants(
        L=max(c.L for c in points),
        sigma_L2=max(c.sigma_L2 for c in points),
        sigma_G2=max(c.sigma_G2 for c in points),
        sigma_G2_mean=max(c.sigma_G2_mean for c in points),
        value=points[0].value,
        grad_sq=points[0].grad_sq,
        batch_size=points[0].batch_size,
    )


def flat_gradient(objective: FederatedObjective, params: Tensors) -> torch.Tensor:
    """The full-batch gradient of ``F`` (equal client weights), flattened, float64."""
    return torch.stack(
        [flat(objective.client_value_and_grad(params, i)[1]) for i in range(objective.num_clients)]
    ).mean(0)
