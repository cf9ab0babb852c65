"""The cut exchange of asynchronous CSE-FSL: a dispatched client's smashed-data uploads go on the ledger
and on its simulated timeline, and wait as events for the shared server instead of being served at once.

Aux-head clients get nothing back from the server, so a client's whole local run can be computed when it
is dispatched (the dispatched group together, on either executor); each of its uploads is kept with the
time it reaches the server, and the server learns from it when the event queue gets there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedge.algorithms.split.exchange import ServerExchange
from fedge.algorithms.split.order import ArrivalOrder
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import CutBatch, Served


@dataclass(frozen=True)
class Upload:
    """One row's smashed data and labels as the server receives them (the first ``count`` of the batch
    are real), its noise key for the server's random layers, and when it arrives (seconds since the
    dispatch)."""

    row: int
    arrival: float
    z: torch.Tensor
    y: torch.Tensor
    count: int
    key: torch.Tensor | None

    def batch(self) -> CutBatch:
        """The upload as a cut batch of one row."""
        counts = torch.tensor([self.count], device=self.z.device)
        keys = None if self.key is None else self.key[None]
        return CutBatch(None, self.z[None], self.y[None], counts, keys)


class DeferredExchange(ServerExchange):
    """:class:`~fedge.algorithms.split.exchange.ServerExchange`'s uploads, placed on the round's arrival
    timeline (:meth:`~fedge.algorithms.split.order.ArrivalOrder.place`) and collected rather than served."""

    order: ArrivalOrder

    def __init__(self, *args: Any, **kwargs: Any):  # ServerExchange's arguments
        super().__init__(*args, **kwargs)
        self.collected: list[Upload] = []

    def __call__(self, rnd: Round, row_ids: torch.Tensor, batch: CutBatch, step: int, grad_z: bool) -> Served:
        """Send step ``step``'s cut batch of rows ``row_ids`` and keep each sending row's upload with its
        arrival time; the answer is empty (aux-head clients wait for nothing)."""
        cohort = rnd.cohort
        senders = [rnd.nodes[int(r)] for r in row_ids]
        at, lengths = row_ids.cpu().numpy(), self.runtime.local_rows(cohort, batch.counts)
        batch = self.noised(rnd, cohort, at, batch, lengths, step)
        sent = self._upload(rnd, cohort, senders, batch, lengths)
        rnd.tally.served(at, sent.bits, batch.counts)
        sending, arrival = self.order.place(rnd, at, sent.bits, batch.counts)
        z, counts = sent.batch.z, batch.counts.tolist()
        for i, r in enumerate(sending):
            key = None if batch.keys is None else batch.keys[r]
            self.collected.append(Upload(int(at[r]), float(arrival[i]), z[r], batch.y[r], counts[r], key))
        return Served(torch.zeros(len(counts), device=z.device), None)

    def take(self) -> list[Upload]:
        """The uploads collected since the last call, in the order they were sent (step by step, rows in
        order)."""
        collected, self.collected = self.collected, []
        return collected
