"""The cohort seam: which rows of a set of participants this process runs, and how they come back.

An algorithm says what each participant does; a :class:`Cohort` says which of those rows this process
owns and puts the processes' results back together exactly as one process would have them. In one
process every method is the identity (or the plain send), so an algorithm written against a cohort runs
unchanged in one process or under ``torchrun`` (docs/scale-out.md). Algorithms get cohorts from their
context's :class:`Cohorts` and never see process groups or shards.

Two kinds of cohort:

- :meth:`Cohorts.of` a round's participants (stateless algorithms: the cohort changes every round),
  split over the processes in contiguous blocks;
- :meth:`Cohorts.clients` the run's fixed client ids ``0..n-1`` (stateful algorithms keep their rows for
  the whole run).

Rows are contiguous per process, so concatenating the processes' rows in rank order gives back cohort
order, and every gather and sum is exact (integers stay integers; floating sums are sums of partial
sums, per dtype).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from fedge.comm.link import Link, Nodes, Sent
from fedge.distributed.group import SINGLE, Group
from fedge.distributed.links import send_rows
from fedge.distributed.shards import Shard, balanced, blocks
from fedge.tensors import Tensors

T = TypeVar("T")


@dataclass(frozen=True)
class Cohort:
    """Rows ``[start, stop)`` of a cohort of ``total`` rows run by this process, with the collectives that
    bring every process's rows together."""

    _group: Group
    _shard: Shard

    @property
    def start(self) -> int:
        """This process's first row."""
        return self._shard.start

    @property
    def stop(self) -> int:
        """One past this process's last row."""
        return self._shard.stop

    @property
    def total(self) -> int:
        """Rows of the whole cohort, over every process."""
        return self._shard.total

    @property
    def rows(self) -> slice:
        """This process's rows of a cohort-long array."""
        return self._shard.rows

    @property
    def spread(self) -> bool:
        """Whether the cohort's rows are spread over several processes (else every row is here)."""
        return self._group.distributed

    def __len__(self) -> int:
        return len(self._shard)

    def take(self, items: np.ndarray | Sequence[T]) -> np.ndarray | list[T]:
        """This process's part of a cohort-long array or list."""
        if isinstance(items, np.ndarray):
            return self._shard.take(items)
        return list(items)[self.start : self.stop]

    def take_rows(self, tensors: Tensors) -> Tensors:
        """This process's rows (dimension 0) of cohort-long stacked tensors."""
        return {k: v[self.rows] for k, v in tensors.items()}

    def part(self, rows: slice) -> Cohort:
        """The sub-cohort of cohort rows ``rows`` (e.g. one cell's clients): the rows of it this process
        runs, numbered from ``rows.start``."""
        start = min(max(self.start, rows.start), rows.stop)
        stop = max(min(self.stop, rows.stop), start)
        return Cohort(self._group, Shard(start - rows.start, stop - rows.start, rows.stop - rows.start))

    def send(
        self,
        link: Link,
        round_: int,
        src: Nodes,
        dst: Nodes,
        kind: str,
        payload: Tensors,
        *,
        lengths: np.ndarray | torch.Tensor | None = None,
        entry_mask: torch.Tensor | None = None,
        record: bool = True,
    ) -> Sent:
        """A stacked send of this process's rows of the cohort: ``src``/``dst`` name the whole cohort's
        senders and receivers, ``payload`` (and ``lengths``, ``entry_mask``) hold this process's rows. Returns
        this process's received rows and the bits of *every* cohort row; the ledger on every process gets
        the whole cohort's entries (none when ``record`` is false: :meth:`fedge.comm.Link.send`), and a
        stochastic codec draws row ``r``'s noise as one process does."""
        return send_rows(
            self._group,
            link,
            round_,
            src,
            dst,
            kind,
            payload,
            self._shard,
            lengths=lengths,
            entry_mask=entry_mask,
            record=record,
        )

    def sum(self, tensors: Tensors) -> Tensors:
        """Per-process partial sums added up over the processes (floating: sum; integer: maximum)."""
        return self._group.sum_tensors(tensors)

    def sum_float(self, value: float) -> float:
        """A per-process partial sum added up over the processes, in float64."""
        return self._group.sum_float(value)

    def gather(self, tensors: Tensors) -> Tensors:
        """Every process's rows (dimension 0), concatenated in cohort order."""
        return self._group.gather_rows(tensors)

    def gather_array(self, values: np.ndarray) -> np.ndarray:
        """Every process's 1-D array, concatenated in cohort order (exact)."""
        return self._group.gather_array(values)

    def client_means(self, clients: np.ndarray, tensors: Tensors) -> dict[int, Tensors]:
        """Each client's mean of its rows of ``tensors`` (this process's rows; a client drawn several times
        has several), where ``clients`` names every row of the cohort in row order; every process gets
        every client's."""
        every = self.gather(tensors)
        device = next(iter(every.values())).device
        means = {}
        for client in np.unique(clients):
            picked = torch.as_tensor(np.flatnonzero(clients == client), device=device)
            means[int(client)] = {name: t[picked].mean(dim=0) for name, t in every.items()}
        return means

    def broadcast(self, value: T) -> T:
        """The first process's (picklable) value on every process."""
        return self._group.broadcast(value)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean over the cohort of a per-row value (``values``: this process's rows); over several
        processes a float64 sum of the processes' sums."""
        if not self.spread:
            return values.mean()
        return torch.tensor(self.sum_float(float(values.double().sum())) / self.total)

    def map(self, work: Callable[[slice], Tensors], tally: Sequence[np.ndarray] = ()) -> Tensors:
        """``work`` on this process's rows; its tensors (rows in dimension 0) gathered in cohort order.
        ``tally``: counters ``work`` adds to in place (e.g. samples per client); each ends holding every
        process's additions (summed in float64: exact for counts). In one process: ``work`` on every row.
        """
        if not self.spread:
            return work(self.rows)
        before = [np.array(counter, copy=True) for counter in tally]
        out = work(self.rows)
        pairs = list(zip(tally, before, strict=True))
        summed = self.sum(
            {str(i): torch.from_numpy((c - b).astype(np.float64)) for i, (c, b) in enumerate(pairs)}
        )
        for i, (counter, start) in enumerate(pairs):
            counter[...] = start + summed[str(i)].numpy().astype(counter.dtype)
        return self.gather(out)


class Cohorts:
    """Makes cohorts over the run's processes (one process unless launched as ranks)."""

    def __init__(self, group: Group = SINGLE):
        self._group = group

    @property
    def group(self) -> Group:
        """The process group under the cohorts: the runner's (who writes, barriers), never an algorithm's."""
        return self._group

    @property
    def processes(self) -> int:
        """How many processes share the run's rows."""
        return self._group.size

    @property
    def spread(self) -> bool:
        """Whether rows are spread over several processes."""
        return self._group.distributed

    def of(self, total: int) -> Cohort:
        """A round's cohort of ``total`` rows, split in contiguous blocks over the processes."""
        return Cohort(self._group, balanced(total, self._group.rank, self._group.size))

    def clients(self, num_clients: int) -> Cohort:
        """The run's clients ``0..num_clients-1`` as a fixed cohort (the same rows every round)."""
        return Cohort(self._group, blocks(num_clients, self._group.rank, self._group.size))

    def whole(self, total: int) -> Cohort:
        """A cohort of ``total`` rows that this process runs entirely, whatever the processes (work every
        process repeats, like a shared server's)."""
        return Cohort(SINGLE, balanced(total, 0, 1))


SINGLE_PROCESS = Cohorts()
