"""FedAsync (Xie et al., 2019): every update mixed into the model the moment it arrives."""

from __future__ import annotations

from fedge.algorithms.asynchronous.config import FedAsyncConfig
from fedge.algorithms.asynchronous.server import AsyncServer
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
        for arrival in arrivals:
            alpha = self.mixing(self.staleness(arrival))
            model = arrival.received or {}
            self.params = {k: (1.0 - alpha) * v + alpha * model[k] for k, v in self.params.items()}
            self.buffers = {
                k: (1.0 - alpha) * v + alpha * model[k] if k in model else v for k, v in self.buffers.items()
            }
        self.merge_integers(arrivals)


def staleness_weight(cfg: FedAsyncConfig, tau: int) -> float:
    """``s(tau)``, FedAsync's staleness function as ``cfg.staleness`` names it."""
    if cfg.staleness == "polynomial":
        return (1.0 + tau) ** (-cfg.exponent)
    if cfg.staleness == "hinge" and tau > cfg.hinge_b:
        return 1.0 / (cfg.hinge_a * (tau - cfg.hinge_b) + 1.0)
    return 1.0
