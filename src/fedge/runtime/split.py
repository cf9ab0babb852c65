"""The split round's pipes: which rows of a round this process runs, the transfers across the cut and of
the client models, the server's aggregation, storage and the clock.

A split round (SplitFed v1/v2, FSL_AN, CSE-FSL, FSL-SAGE, lightweight FedSL) is its paper's lines -- the
clients' steps, the server's answer, the average of the client models -- around the same pipes as
FedAvg's (:mod:`~fedge.runtime.star`): the round's rows may be spread over processes (its cohort), each
process stepping its own rows; every send goes through the cohort, so every process's ledger records
the whole round's traffic; the server aggregates through its pipeline; the server and the participants
hold what they store; the round ends by charging the cost the family's rule in :mod:`fedge.system`
gave. :class:`SplitRuntime` does that work, so that no split algorithm writes a cohort's row
arithmetic, a storage hold or a clock charge itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import torch

from fedge.aggregation import Updates, sites
from fedge.comm import Link, Sent, nodes
from fedge.comm.link import Nodes
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.runtime.context import Context
from fedge.system import RoundCost
from fedge.tensors import Tensors

Rows = TypeVar("Rows", np.ndarray, torch.Tensor)
T = TypeVar("T")


class SplitRows(Protocol):
    """What the runtime reads of a split round: its number, every row's node name and aggregation
    weight, and which rows this process runs (``cohort``)."""

    t: int
    nodes: list[str]
    weights: torch.Tensor
    cohort: Cohort


@dataclass(frozen=True)
class RowAggregation:
    """One aggregation at the server of the rows of round ``t`` that ``cohort`` spreads over the
    processes (a split server's copies, say)."""

    runtime: SplitRuntime
    t: int
    cohort: Cohort

    def average(self, stacked: Tensors, weights: torch.Tensor, reference: Tensors | None = None) -> Tensors:
        """The new state from this process's rows ``stacked`` and their ``weights``, through the server's
        pipeline (:meth:`SplitRuntime.aggregate`)."""
        return self.runtime.aggregate(self.t, self.cohort, stacked, weights, reference)

    def from_first(self, value: T) -> T:
        """The (picklable) value of the process that runs the round's first row, on every process."""
        return self.cohort.broadcast(value)


class SplitRuntime:
    """The pipes of the split rounds of an algorithm built from ``ctx``."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    # ----- the rows this process runs ----------------------------------------------------------------

    def clients(self, count: int) -> Cohort:
        """The run's ``count`` clients as rows, spread over the processes (all of them in one process)."""
        return self.ctx.cohorts.clients(count)

    def whole(self, count: int) -> Cohort:
        """A round of ``count`` rows that every process runs whole (one row at a time, say)."""
        return self.ctx.cohorts.whole(count)

    def bank(self, cohort: Cohort, clients: np.ndarray) -> ClientBank:
        """An empty bank of this process's rows of a round whose rows are ``clients``."""
        return ClientBank(tuple(int(c) for c in self.local_clients(cohort, clients)), {})

    def local_clients(self, cohort: Cohort, clients: np.ndarray) -> np.ndarray:
        """The clients of this process's rows of a round whose rows are ``clients``."""
        return np.asarray(cohort.take(clients))

    def local_rows(self, cohort: Cohort, values: Rows) -> Rows:
        """This process's rows (dimension 0) of a value every row of the round has."""
        return values[cohort.rows]

    def local_row_ids(self, cohort: Cohort) -> np.ndarray:
        """The numbers (in the round) of this process's rows."""
        return np.arange(cohort.total)[cohort.rows]

    def local_slice(self, cohort: Cohort) -> slice:
        """This process's rows of the round, as a slice (for a value indexed again later)."""
        return cohort.rows

    def first_row(self, cohort: Cohort) -> int:
        """The number in the round of this process's first row (row-keyed draws count from it)."""
        return cohort.start

    def row_weights(self, rnd: SplitRows) -> torch.Tensor:
        """This process's rows' aggregation weights."""
        return rnd.weights[rnd.cohort.rows]

    # ----- transfers ---------------------------------------------------------------------------------

    def broadcast(self, link: Link, t: int, receivers: list[str], kind: str, payload: Tensors) -> Sent:
        """The server sends one ``payload`` to every one of ``receivers`` (one encoding for all)."""
        return link.send(t, nodes.SERVER, receivers, kind, payload)

    def upload(
        self,
        cohort: Cohort,
        link: Link,
        t: int,
        senders: list[str],
        kind: str,
        payload: Tensors,
        *,
        lengths: np.ndarray | torch.Tensor | None = None,
        entry_mask: torch.Tensor | None = None,
        record: bool = True,
    ) -> Sent:
        """Every row's ``senders[r]`` sends the server its row of ``payload`` (this process's rows); the
        server's decoded rows and every row's bits (:meth:`~fedge.distributed.Cohort.send`; on the
        ledger unless ``record`` is false)."""
        return cohort.send(
            link,
            t,
            senders,
            nodes.SERVER,
            kind,
            payload,
            lengths=lengths,
            entry_mask=entry_mask,
            record=record,
        )

    def answer(
        self,
        cohort: Cohort,
        link: Link,
        t: int,
        receivers: list[str],
        kind: str,
        payload: Tensors,
        *,
        lengths: np.ndarray | torch.Tensor | None = None,
        entry_mask: torch.Tensor | None = None,
    ) -> Sent:
        """The server sends each row's ``receivers[r]`` its row of ``payload`` (this process's rows)."""
        return cohort.send(
            link, t, nodes.SERVER, receivers, kind, payload, lengths=lengths, entry_mask=entry_mask
        )

    def collect(self, rnd: SplitRows, link: Link, kind: str, payload: Tensors) -> Sent:
        """Every participant uploads its row of ``payload`` (this process's rows) to the server, for its
        aggregation (on the ledger unless the server's reducer records the upload itself:
        :meth:`~fedge.runtime.context.Context.records_upload`)."""
        record = self.ctx.records_upload(sites.SERVER)
        return self.upload(rnd.cohort, link, rnd.t, rnd.nodes, kind, payload, record=record)

    def gather(self, cohort: Cohort, tensors: Tensors) -> Tensors:
        """Every row of stacked ``tensors`` (this process's rows), on every process, in row order."""
        return cohort.gather(tensors)

    def gather_array(self, cohort: Cohort, values: np.ndarray) -> np.ndarray:
        """Every row of a per-row array (this process's rows), on every process, in row order."""
        return cohort.gather_array(values)

    def add_up(self, cohort: Cohort, tensors: Tensors) -> Tensors:
        """Per-process partial sums added up over the processes that run the round's rows."""
        return cohort.sum(tensors) if cohort.spread else tensors

    # ----- aggregation, storage and the clock --------------------------------------------------------

    def aggregate(
        self,
        t: int,
        cohort: Cohort,
        stacked: Tensors,
        weights: torch.Tensor,
        reference: Tensors | None = None,
    ) -> Tensors:
        """The server's new state from this process's rows ``stacked`` weighted by ``weights``, through
        the server's pipeline (by default the weighted sum); ``reference`` is the state the rows started
        from."""
        updates = Updates.of(sites.SERVER, t, stacked, weights, reference)
        return self.ctx.pipeline(sites.SERVER).reduce(updates, cohort)

    def aggregation(self, t: int, cohort: Cohort) -> RowAggregation:
        """The server's aggregation of the rows of round ``t`` spread over ``cohort``."""
        return RowAggregation(self, t, cohort)

    def store(self, holders: Nodes, kind: str, bits: int) -> None:
        """``holders`` store ``bits`` of ``kind`` (the ledger's storage)."""
        self.ctx.network.hold(holders, kind, bits)

    def close(self, cost: RoundCost) -> None:
        """End the round on the simulated clock: its latency and energy as the family's rule in
        :mod:`fedge.system` gave them."""
        self.ctx.system.charge(cost)
