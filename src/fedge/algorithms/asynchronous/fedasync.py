"""FedAsync (Xie et al., 2019): every update mixed into the model the moment it arrives."""

from __future__ import annotations

from typing import Any

from fedge.algorithms.asynchronous.config import FedAsyncConfig
from fedge.algorithms.asynchronous.server import AsyncServer
from fedge.algorithms.base import register


@register("fedasync", FedAsyncConfig, "FedAsync: asynchronous clients, each update mixed in by its staleness")
class FedAsync(AsyncServer):
    """One aggregation per arrival: ``x = (1 - a_t) x + a_t x_k`` with ``a_t = mixing * s(tau)``,
    ``s(tau) = (1 + tau)^(-exponent)`` (polynomial) or 1 (constant); ``server_lr`` scales ``a_t``
    (capped at 1)."""

    def due(self) -> bool:
        return len(self.arrived) >= 1

    def mixing(self, tau: int) -> float:
        """The weight of an update ``tau`` versions old."""
        cfg: FedAsyncConfig = self.cfg
        decay = (1.0 + tau) ** (-cfg.exponent) if cfg.staleness == "polynomial" else 1.0
        return min(1.0, cfg.server_lr * cfg.mixing * decay)

    def aggregate(self, updates: list[dict[str, Any]]) -> None:
        for update in updates:
            alpha = self.mixing(self.staleness(update))
            model = update["model"]
            self.params = {k: (1.0 - alpha) * v + alpha * model[k] for k, v in self.params.items()}
            self.buffers = {
                k: (1.0 - alpha) * v + alpha * model[k] if k in model else v for k, v in self.buffers.items()
            }
        self.merge_integers(updates)
