"""FedAsync (Xie et al., 2019): every update mixed into the model the moment it arrives."""

from __future__ import annotations

import torch

from fedge.aggregation import Part, Updates, sites
from fedge.algorithms.asynchronous.config import FedAsyncConfig
from fedge.algorithms.asynchronous.server import AsyncServer, uploaded
from fedge.algorithms.base import Context, register
from fedge.runtime.asynchronous import Arrival


@register("fedasync", FedAsyncConfig, "FedAsync: asynchronous clients, each update mixed in by its staleness")
class FedAsync(AsyncServer):
    """One aggregation per arrival: ``x = (1 - a_t) x + a_t x_k`` with ``a_t = mixing * s(tau)``, the
    paper's staleness functions ``s``: ``(1 + tau)^(-exponent)`` (polynomial), 1 (constant), or the hinge
    (1 while ``tau <= hinge_b``, then ``1 / (hinge_a (tau - hinge_b) + 1)``); ``server_lr`` scales
    ``a_t`` (capped at 1). Clients train on the paper's regularised objective, their loss plus
    ``proximal_mu / 2 ||x - x_tau||^2`` (:class:`~fedge.algorithms.asynchronous.work.ProximalLoss`)."""

    def __init__(self, ctx: Context, cfg: FedAsyncConfig):
        super().__init__(ctx, cfg, cfg.proximal_mu)

    def due(self, arrived: int) -> bool:
        return arrived >= 1

    def mixing(self, tau: int) -> float:
        """The weight of an update ``tau`` versions old."""
        cfg: FedAsyncConfig = self.cfg
        return min(1.0, cfg.server_lr * cfg.mixing * staleness_weight(cfg, tau))

    def aggregate(self, t: int, arrivals: list[Arrival]) -> None:
        """Each arrival mixed in through the buffer's pipeline: the server's own model weighs ``1 - a``,
        the arrived one ``a`` (two parts, so the default mean computes ``(1 - a) x + a x_k`` exactly)."""
        buffer = self.ctx.pipeline(sites.BUFFER)
        for arrival in arrivals:
            alpha = self.mixing(self.staleness(arrival))
            model = uploaded(arrival)
            current = {k: v for k, v in {**self.params, **self.buffers}.items() if k in model}
            own = Part({k: v[None] for k, v in current.items()}, _weight(1.0 - alpha, self.ctx.device))
            arrived = Part({k: model[k][None] for k in current}, _weight(alpha, self.ctx.device))
            mixed = buffer.reduce(Updates(sites.BUFFER, self.version + 1, (own, arrived), current))
            self.params = {k: mixed[k] for k in self.params}
            self.buffers = {k: mixed.get(k, v) for k, v in self.buffers.items()}
        self.merge_integers(arrivals)


def _weight(value: float, device: torch.device) -> torch.Tensor:
    """One row's weight (float64, like every site's weights)."""
    return torch.tensor([value], dtype=torch.float64, device=device)


def staleness_weight(cfg: FedAsyncConfig, tau: int) -> float:
    """``s(tau)``, FedAsync's staleness function as ``cfg.staleness`` names it."""
    if cfg.staleness == "polynomial":
        return (1.0 + tau) ** (-cfg.exponent)
    if cfg.staleness == "hinge" and tau > cfg.hinge_b:
        return 1.0 / (cfg.hinge_a * (tau - cfg.hinge_b) + 1.0)
    return 1.0
