"""The round of a synchronous server with a deadline: the server's storage, the ledger's record of the
uploads a deadline cut short, and the clock (:func:`fedge.system.deadline.deadline_round`), so that
``fedavg_deadline`` writes no storage hold or clock charge itself."""

from __future__ import annotations

import numpy as np
import torch

from fedge.comm import Link, nodes
from fedge.runtime.context import Context
from fedge.system.deadline import deadline_round
from fedge.system.model import PhaseCost
from fedge.tensors import Tensors

LATE_KIND = "model_up_late"  # the part of a dropped client's upload sent before the round ended


class DeadlineRuntime:
    """The rounds of a server with a deadline whose uploads go through ``up``; the server holds its
    initial ``state``."""

    def __init__(self, ctx: Context, up: Link, state: Tensors):
        self.ctx, self.up = ctx, up
        ctx.network.hold(nodes.SERVER, "model", state)

    def close(
        self,
        t: int,
        clients: np.ndarray,
        phases: tuple[PhaseCost, PhaseCost, PhaseCost],
        full: np.ndarray,
        done: np.ndarray,
        kept: np.ndarray,
        end: float,
        values: int,
    ) -> None:
        """End round ``t`` at ``end`` (:func:`~fedge.system.deadline.deadline_round`): the bits each late
        upload carried before then go on the ledger as :data:`LATE_KIND`, the cost on the clock."""
        closed = deadline_round(phases, full, done, kept, end, values)
        late = closed.late
        if len(late):  # the values each late upload carried before the round ended, through the link
            cut = {"model": torch.zeros(len(late), values, device=self.ctx.device)}
            senders = nodes.clients(clients[late])
            self.up.send(t, senders, nodes.SERVER, LATE_KIND, cut, stacked=True, lengths=closed.carried)
        self.ctx.system.charge(closed.cost)

    def store(self, receivers: list[str], state: Tensors) -> None:
        """The clients that sent their model hold the new one (a FedAvg client keeps the last it got)."""
        self.ctx.network.hold(receivers, "model", state)
