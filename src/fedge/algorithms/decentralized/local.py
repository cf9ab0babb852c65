"""Local training only: every client trains its own model and talks to nobody (AFIND+ Table 1, "Local")."""

from __future__ import annotations

from typing import Literal

import torch

from fedge.algorithms.base import register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.metrics import RoundReport


class LocalConfig(PeerConfig):
    """The backbone's knobs; ``peers`` and ``topology`` are accepted (for comparisons) and unused."""

    name: Literal["local"] = "local"
    """the algorithm (`fedge list`)"""


@register("local", LocalConfig, "Local: each client trains alone, no communication (fine-tuned evaluation)")
class Local(PeerAlgorithm):
    """The no-collaboration reference of the decentralized family."""

    def peer_round(self, t: int) -> RoundReport:
        own = torch.arange(self.num_clients, device=self.ctx.device)
        params, buffers = self.rows(own)
        params, buffers, losses = self.local_update(params, buffers, own.tolist(), t)
        self.bank.adopt(params, buffers, owned=False)
        return RoundReport(float(losses.double().mean()))
