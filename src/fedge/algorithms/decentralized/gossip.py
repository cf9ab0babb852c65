"""Gossip sampling (Hegedűs et al. 2019): random neighbours, uniform averaging (a baseline of AFIND+ Table 1).

Each round every client trains its own model, then averages it uniformly with the trained models of
``peers`` neighbours drawn uniformly without replacement (all of them if it has fewer). On the FedAvg-FT
backbone this is also the "FedAvg-FT" row of the ablation (Table 2).
"""

from __future__ import annotations

from typing import Literal

import torch

from fedge.algorithms.base import register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.scores import selection_metrics
from fedge.engine.mixing import uniform_rows
from fedge.metrics import RoundReport


class GossipConfig(PeerConfig):
    """The backbone's knobs; ``peers`` neighbours per client and round."""

    name: Literal["gossip"] = "gossip"
    """the algorithm (`fedge list`)"""


@register("gossip", GossipConfig, "Gossip: random neighbours each round, uniform model averaging")
class Gossip(PeerAlgorithm):
    """Random peers, uniform weights (own model included): one ``[n, n]`` mixing product per round."""

    def peer_round(self, t: int) -> RoundReport:
        own = torch.arange(self.num_clients, device=self.ctx.device)
        params, buffers = self.rows(own)
        params, buffers, losses = self.local_update(params, buffers, own.tolist(), t)
        chosen = torch.as_tensor(self.random_peers(t), device=self.ctx.device)
        self.bank.adopt(*self.mixed(uniform_rows(chosen), params, buffers), owned=False)
        self.send_models(chosen)
        return RoundReport(float(losses.double().mean()), selection_metrics(chosen))
