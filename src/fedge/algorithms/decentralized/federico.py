"""FedeRiCo-style selection (Sui et al. 2022, "Find your friends"), approximated (AFIND+ Table 1's baseline).

Each client keeps a smoothed loss ``l[i, j]`` (EMA with coefficient ``ema``) of neighbour j's model on
its own probe batch, and ``l[i, i]`` of its own. Each round, with probability ``epsilon`` it samples
``peers`` random neighbours, otherwise the ``peers`` with the lowest smoothed loss (never-scored
neighbours first, in random order: optimistic exploration). It updates the losses of the sampled
models and mixes them with itself by ``softmax(-l)`` over that set. The original method's EM details
are not in the AFIND+ paper; epsilon, the EMA and the sample size are our choices.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.scores import boltzmann_weights, selection_metrics, top_k
from fedge.metrics import RoundReport
from fedge.rng import numpy_rng

Unit = Annotated[float, Field(ge=0.0, le=1.0)]


class FedericoConfig(PeerConfig):
    """Exploration probability and the EMA coefficient of the loss estimates."""

    name: Literal["federico"] = "federico"
    """the algorithm (`fedge list`)"""
    epsilon: Unit = 0.3
    """probability of exploring a random neighbour"""
    ema: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.5
    """EMA coefficient of the neighbours' loss estimates"""


@register(
    "federico",
    FedericoConfig,
    "FedeRiCo (approx.): epsilon-greedy peers by smoothed loss, softmax(-loss) mix",
)
class Federico(PeerAlgorithm):
    """Loss-driven epsilon-greedy selection and loss-softmax aggregation."""

    cfg: FedericoConfig
    state_fields = (*PeerAlgorithm.state_fields, "loss", "seen")

    def __init__(self, ctx: Context, cfg: FedericoConfig):
        super().__init__(ctx, cfg)
        n = self.num_clients
        self.loss = torch.zeros(n, n, dtype=torch.float64, device=ctx.device)
        self.seen = torch.zeros(n, n, dtype=torch.bool, device=ctx.device)

    def _choose(self, t: int) -> torch.Tensor:
        n, cfg = self.num_clients, self.cfg
        explore = np.zeros(n, dtype=bool)
        jitter = np.zeros((n, n))
        for i in range(n):
            rng = numpy_rng(self.ctx.seed, "federico", t, i)
            explore[i] = rng.random() < cfg.epsilon
            jitter[i] = rng.random(n)
        device = self.neighbours.device
        unseen = torch.as_tensor(jitter, device=device) + 1e9  # untried first, in random order
        greedy = top_k(torch.where(self.seen, -self.loss, unseen), self.neighbours, cfg.peers)
        random = torch.as_tensor(self.random_peers(t), device=device)
        return torch.where(torch.as_tensor(explore, device=device)[:, None], random, greedy)

    def peer_round(self, t: int) -> RoundReport:
        n = self.num_clients
        own = torch.arange(n, device=self.ctx.device)
        params, buffers = self.rows(own)
        params, buffers, losses = self.local_update(params, buffers, own.tolist(), t)
        chosen = self._choose(t)
        eye = torch.eye(n, dtype=torch.bool, device=own.device)
        scored = chosen | eye
        i, j = scored.nonzero(as_tuple=True)
        fresh = torch.zeros_like(self.loss)
        fresh[i, j] = self.losses_on(*self.scored(params, buffers), (j, i, i), self.probes(t)).double()
        smoothed = self.cfg.ema * self.loss + (1.0 - self.cfg.ema) * fresh
        self.loss = torch.where(scored, torch.where(self.seen, smoothed, fresh), self.loss)
        self.seen |= scored
        weights = boltzmann_weights(self.loss, scored, 1.0)
        self.bank.adopt(*self.mixed(weights, params, buffers), owned=False)
        self.send_models(chosen)
        return RoundReport(float(losses.double().mean()), selection_metrics(chosen))
