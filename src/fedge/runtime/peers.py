"""The peer round: clients on a graph that train, talk to their neighbours and mix what they receive.

A decentralized round (gossip, AFIND+, PENS, FedeRiCo, FedFomo, Ditto, Dis-PFL) is its paper's lines --
train, choose peers, exchange, mix -- around the same pipes: spread a cohort of rows over the run's
processes (each process works on its rows, every process gets every result and the whole cohort's
compute tally), send messages between neighbours over links, hold what every client stores, and close
the round on the clock by the peer rule (:func:`fedge.system.peer_round`). :class:`PeerRuntime` opens a
round; :class:`PeerRound` does those steps, so that no algorithm writes a link send, a storage hold,
cohort row arithmetic or a latency formula itself. :func:`client_block` is this process's block of the
clients for the per-client evaluation every personalised algorithm shares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedge.comm import Link, nodes
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.runtime.context import Context
from fedge.system import RoundWork, peer_round
from fedge.tensors import Tensors


@dataclass
class PeerRound:
    """Round ``round`` of ``num_clients`` peers: its compute tally (:attr:`work`) and its transfers."""

    ctx: Context
    round: int
    num_clients: int
    work: RoundWork = field(init=False)

    def __post_init__(self) -> None:
        self.work = RoundWork(self.num_clients)

    def map(self, total: int, work: Callable[[slice], Tensors]) -> Tensors:
        """``work(rows)`` on this process's rows of a cohort of ``total`` rows (all of them in one
        process); its tensors (rows in dimension 0) come back in row order and the compute it tallied is
        the whole cohort's, so every process holds every row and charges the clock the same work
        (docs/scale-out.md)."""
        cohort = self.ctx.cohorts.of(total)
        return cohort.map(work, tally=(self.work.forward, self.work.backward))

    def send(
        self, link: Link, pairs: np.ndarray | torch.Tensor, kind: str, message: Tensors, to_requester: bool
    ) -> int:
        """Send ``message`` over ``link`` as ``kind`` for every ``pairs[i, j]``: j to i when
        ``to_requester``, else i to j. Returns the number of transfers."""
        i, j = np.nonzero(np.asarray(torch.as_tensor(pairs).cpu()))
        if len(i):
            src, dst = (j, i) if to_requester else (i, j)
            link.send(self.round, nodes.clients(src), nodes.clients(dst), kind, message)
        return len(i)

    def account(
        self,
        link: Link,
        pairs: np.ndarray | torch.Tensor,
        kind: str,
        shapes: Mapping[str, Sequence[int]],
        to_requester: bool,
        nonzeros: Mapping[str, int] | None = None,
    ) -> int:
        """Record, as :meth:`send` of a message shaped ``shapes`` would, its transfer for every
        ``pairs[i, j]`` (:meth:`Link.account`: metered, not encoded; ``nonzeros`` for codecs that count
        non-zero values). Returns the number of transfers."""
        i, j = np.nonzero(np.asarray(torch.as_tensor(pairs).cpu()))
        if len(i):
            src, dst = (j, i) if to_requester else (i, j)
            link.account(self.round, nodes.clients(src), nodes.clients(dst), kind, shapes, nonzeros)
        return len(i)

    def received(self, link: Link, kind: str, stacked: Tensors) -> Tensors:
        """Stacked rows as the peers that receive them over ``link`` decode them (each sender's row with
        its own link-derived randomness; the transfers themselves are recorded by :meth:`send`)."""
        return link.decode(self.round, kind, stacked)

    def close(self, flops_per_sample: float) -> None:
        """Advance the clock by the peer rule: every client's tallied compute and the peer traffic the
        round's links recorded."""
        system = self.ctx.system
        flops = self.work.flops(flops_per_sample)
        system.charge(peer_round(system, self.round, flops, self.ctx.network.traffic(self.round)))


class PeerRuntime:
    """Opens the peer rounds of ``num_clients`` clients, and meters what every client holds."""

    def __init__(self, ctx: Context, num_clients: int):
        self.ctx, self.num_clients = ctx, num_clients

    def open(self, t: int) -> PeerRound:
        """Round ``t``, with an empty compute tally."""
        return PeerRound(self.ctx, t, self.num_clients)

    def meter_storage(self, kind: str, state: Tensors) -> None:
        """Every client stores ``state`` (one client's copy) as ``kind``."""
        self.ctx.network.hold(nodes.clients(range(self.num_clients)), kind, state)


@dataclass(frozen=True)
class ClientBlock:
    """This process's block of the run's clients (all of them in one process): each process fine-tunes
    and tests its block (docs/scale-out.md)."""

    cohort: Cohort

    @property
    def clients(self) -> range:
        """The block's clients."""
        return range(self.cohort.start, self.cohort.stop)

    def bank(self, bank: ClientBank) -> ClientBank:
        """The block's rows of ``bank`` (one row per client, in client order)."""
        clients = tuple(int(c) for c in self.cohort.take(bank.clients))
        return ClientBank(clients, self.rows(bank.params), self.rows(bank.buffers))

    def rows(self, tensors: Tensors) -> Tensors:
        """The block's rows of per-client ``tensors``."""
        return self.cohort.take_rows(tensors)


def client_block(ctx: Context, num_clients: int) -> ClientBlock:
    """This process's block of ``num_clients`` clients."""
    return ClientBlock(ctx.cohorts.clients(num_clients))
