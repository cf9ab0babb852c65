"""FedBuff (Nguyen et al., 2022): asynchronous clients, the server aggregating every K arrived updates."""

from __future__ import annotations

import numpy as np
import torch

from fedge.aggregation import Updates, sites
from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.algorithms.asynchronous.config import PAPER_BUFFER, FedBuffConfig
from fedge.algorithms.asynchronous.server import AsyncServer, delta, uploaded
from fedge.algorithms.base import Context, register
from fedge.errors import ConfigError
from fedge.runtime.asynchronous import Arrival
from fedge.runtime.buffer_adversary import poisoned_updates
from fedge.runtime.root import LocalWork, root_update
from fedge.tensors import Tensors, floating


@register("fedbuff", FedBuffConfig, "FedBuff: asynchronous clients, the server aggregates every K updates")
class FedBuff(AsyncServer):
    """The server keeps ``fraction * n`` clients in flight and aggregates once ``buffer_size`` (K)
    updates have arrived: ``x += server_lr * sum_k w_k s(tau_k) (x_k - x_{v_k})``, with ``w_k`` = 1/K
    (``weighting: uniform``, the paper's; 1 / the updates merged when an empty queue merges fewer) or the
    clients' sample shares within the buffer (``samples``) and ``s(tau) = 1 / sqrt(1 + tau)`` (or 1).
    When every update is fresh and the server's step is 1 the new model is the buffer's weighted average
    itself, computed as FedAvg computes it: with sample weights, identical devices and K = cohort,
    FedBuff is FedAvg. An adversary's clients poison their updates in the buffer before it is reduced
    (:mod:`fedge.runtime.buffer_adversary`: each delta from the version it trained from). An ``fltrust``
    buffer is first given the server's root model trained from its current one (:meth:`_root`).
    """

    def __init__(self, ctx: Context, cfg: FedBuffConfig):
        super().__init__(ctx, cfg)
        self.buffer_size = cfg.buffer_size or min(PAPER_BUFFER, self.concurrency)
        if self.buffer_size > self.concurrency:
            raise ConfigError(
                "algorithm.buffer_size",
                f"{self.buffer_size} updates per aggregation, but only {self.concurrency} clients in flight",
            )

    def due(self, arrived: int) -> bool:
        return arrived >= self.buffer_size

    def _root(self, number: int, reducer: FLTrust) -> RootUpdate:
        """FLTrust at the buffer (Cao et al., NDSS 2021): the server's model for merge ``number``, trained
        from its current model on its root set as a client trains (:func:`~fedge.runtime.root.root_update`,
        the root batches keyed by the merge)."""
        cfg = self.cfg
        work = LocalWork(self.work.step, cfg.optimizer.lr, cfg.local_epochs, cfg.batch_size, cfg.drop_last)
        model = (self.params, self.buffers)
        return root_update(self.ctx, number, work, reducer, model, self.work.flops_per_sample)

    def aggregate(self, t: int, arrivals: list[Arrival]) -> None:
        cfg: FedBuffConfig = self.cfg
        sizes = torch.as_tensor(self.sizes[[a.client for a in arrivals]], dtype=torch.float64)
        if cfg.weighting == "uniform":
            sizes = torch.ones_like(sizes)
        weights = (sizes / sizes.sum()).to(self.ctx.device)
        stale = [self.staleness(a) for a in arrivals]
        current = {**self.params, **floating(self.buffers)}
        buffer, number = self.ctx.pipeline(sites.BUFFER), self.version + 1
        clients, received = np.array([a.client for a in arrivals]), [uploaded(a) for a in arrivals]
        if self.adversary is not None:
            bases = [a.payload.base for a in arrivals]
            received = poisoned_updates(self.adversary, t, clients, received, bases)
        trust = buffer.reducer if isinstance(buffer.reducer, FLTrust) else None
        root = None if trust is None else self._root(number, trust)
        if cfg.server_lr == 1.0 and not any(stale):  # FedAvg's average, rounded as FedAvg rounds it
            models = _stacked(received, current)
            if trust is not None:
                trust.root = root
            merged = buffer.reduce(Updates.of(sites.BUFFER, number, models, weights, current))
        else:
            if trust is not None and root is not None:  # the deltas' reference is no change
                trust.root = RootUpdate({k: root.model[k] - v for k, v in current.items()}, root.flops)
            scale = [1.0 / np.sqrt(1.0 + tau) if cfg.staleness == "sqrt" else 1.0 for tau in stale]
            weights = weights * torch.as_tensor(scale, dtype=torch.float64, device=weights.device)
            deltas = _stacked([delta(a, m) for a, m in zip(arrivals, received, strict=True)], current)
            step = buffer.reduce(Updates.of_deltas(sites.BUFFER, number, deltas, weights))
            merged = {k: v + cfg.server_lr * step[k] for k, v in current.items()}
        if self.adversary is not None:
            self.figures = self.adversary.figures(t, clients, weights, buffer)
        self.params = {k: merged[k] for k in self.params}
        self.buffers = {k: merged.get(k, v) for k, v in self.buffers.items()}
        self.merge_integers(arrivals)


def _stacked(models: list[Tensors], names: Tensors) -> Tensors:
    """Each tensor of ``names`` stacked over ``models`` (one row per update)."""
    return {k: torch.stack([model[k] for model in models]) for k in names}
