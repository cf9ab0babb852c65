"""FedAsync (Xie et al., 2019): every update mixed into the model the moment it arrives."""

from __future__ import annotations

import numpy as np
import torch

from fedge.aggregation import Part, Updates, sites
from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.algorithms.asynchronous.config import FedAsyncConfig
from fedge.algorithms.asynchronous.server import AsyncServer, uploaded
from fedge.algorithms.asynchronous.work import ProximalLoss
from fedge.algorithms.base import Context, register
from fedge.config import OMNISCIENT_ATTACKS
from fedge.engine import make_step
from fedge.errors import ConfigError
from fedge.runtime.asynchronous import Arrival
from fedge.runtime.buffer_adversary import combined, poisoned_updates
from fedge.runtime.root import LocalWork, root_update
from fedge.tensors import Tensors


@register("fedasync", FedAsyncConfig, "FedAsync: asynchronous clients, each update mixed in by its staleness")
class FedAsync(AsyncServer):
    """One aggregation per arrival: ``x = (1 - a_t) x + a_t x_k`` with ``a_t = mixing * s(tau)``, the
    paper's staleness functions ``s``: ``(1 + tau)^(-exponent)`` (polynomial), 1 (constant), or the hinge
    (1 while ``tau <= hinge_b``, then ``1 / (hinge_a (tau - hinge_b) + 1)``); ``server_lr`` scales
    ``a_t`` (capped at 1). Clients train on the paper's regularised objective, their loss plus
    ``proximal_mu / 2 ||x - x_tau||^2`` (:class:`~fedge.algorithms.asynchronous.work.ProximalLoss`).
    An adversary's update is poisoned alone as it arrives (:mod:`fedge.runtime.buffer_adversary`); its
    ``malicious_kept`` is the share ``a_t`` of the new model it makes (or what the reducer kept of it)."""

    def __init__(self, ctx: Context, cfg: FedAsyncConfig):
        super().__init__(ctx, cfg, cfg.proximal_mu)
        attack = None if self.adversary is None else self.adversary.config.attack
        if attack in OMNISCIENT_ATTACKS:
            alone = "fedasync merges one update at a time, so there are none"
            reads = f"{attack} reads the honest updates merged with the malicious one"
            raise ConfigError("adversary.attack", f"{reads}; {alone}")

    def due(self, arrived: int) -> bool:
        return arrived >= 1

    def mixing(self, tau: int) -> float:
        """The weight of an update ``tau`` versions old."""
        cfg: FedAsyncConfig = self.cfg
        return min(1.0, cfg.server_lr * cfg.mixing * staleness_weight(cfg, tau))

    def _trusted(self, reducer: FLTrust, current: Tensors, model: Tensors, alpha: float) -> Tensors:
        """FLTrust at FedAsync's server, one update per merge: the change ``x_k - x`` the merge mixes in,
        scored against the server's root update trained from its current model
        (:func:`~fedge.runtime.root.root_update`, batches keyed by the merge's version; the proximal pull
        left out, the root set being the server's own), rescaled to its norm and mixed in by ``a``:
        ``x + a g_k ||g0|| / ||g_k||``, or no change where its trust is 0 (Eq. 7 for one update)."""
        cfg, number = self.cfg, self.version + 1
        loss = self.work.step.loss_fn
        step = make_step(loss.loss if isinstance(loss, ProximalLoss) else loss, self.work.sgd)
        work = LocalWork(step, cfg.optimizer.lr, cfg.local_epochs, cfg.batch_size, cfg.drop_last)
        model_now, per_sample = (self.params, self.buffers), self.work.flops_per_sample
        root = root_update(self.ctx, number, work, reducer, model_now, per_sample)
        reducer.root = RootUpdate({k: root.model[k] - v for k, v in current.items()}, root.flops)
        deltas = {k: (model[k] - v)[None] for k, v in current.items()}
        updates = Updates.of_deltas(sites.BUFFER, number, deltas, _weight(alpha, self.ctx.device))
        change = self.ctx.pipeline(sites.BUFFER).reduce(updates)
        return {k: v + change[k] for k, v in current.items()}

    def aggregate(self, t: int, arrivals: list[Arrival]) -> None:
        """Each arrival mixed in through the buffer's pipeline: the server's own model weighs ``1 - a``,
        the arrived one ``a`` (two parts, so the default mean computes ``(1 - a) x + a x_k`` exactly);
        an ``fltrust`` buffer takes the arrival's change alone (:meth:`_trusted`)."""
        buffer, figures = self.ctx.pipeline(sites.BUFFER), []
        trust = buffer.reducer if isinstance(buffer.reducer, FLTrust) else None
        for arrival in arrivals:
            alpha = self.mixing(self.staleness(arrival))
            model = uploaded(arrival)
            if self.adversary is not None:
                clients = np.array([arrival.client])
                (model,) = poisoned_updates(self.adversary, t, clients, [model], [arrival.payload.base])
            current = {k: v for k, v in {**self.params, **self.buffers}.items() if k in model}
            if trust is not None:
                mixed = self._trusted(trust, current, model, alpha)
                if self.adversary is not None:  # one row: whether the arrival's trust let it in
                    rows = np.array([arrival.client])
                    figures.append(self.adversary.figures(t, rows, _weight(alpha, self.ctx.device), buffer))
                self.params = {k: mixed[k] for k in self.params}
                self.buffers = {k: mixed.get(k, v) for k, v in self.buffers.items()}
                continue
            own = Part({k: v[None] for k, v in current.items()}, _weight(1.0 - alpha, self.ctx.device))
            arrived = Part({k: model[k][None] for k in current}, _weight(alpha, self.ctx.device))
            mixed = buffer.reduce(Updates(sites.BUFFER, self.version + 1, (own, arrived), current))
            if self.adversary is not None:  # the server's own model (row 0) is no client's
                weights = torch.cat([own.weights, arrived.weights])
                rows = np.array([-1, arrival.client])
                figures.append(self.adversary.figures(t, rows, weights, buffer))
            self.params = {k: mixed[k] for k in self.params}
            self.buffers = {k: mixed.get(k, v) for k, v in self.buffers.items()}
        self.merge_integers(arrivals)
        self.figures = combined(figures)


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
