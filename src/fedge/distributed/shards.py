"""Which rows of a cohort a rank owns: contiguous blocks, so rank order is row order.

``balanced`` splits whatever cohort a round has (stateless algorithms: the cohort changes every round);
``blocks`` splits the fixed client ids ``0..n-1`` once (stateful algorithms keep their rows for the whole
run). Both give rank ``r`` the rows ``[start, stop)`` with sizes differing by at most one, so that
concatenating the ranks' rows in rank order gives back the single-process order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` of a cohort of ``total`` rows, owned by one rank."""

    start: int
    stop: int
    total: int

    @property
    def rows(self) -> slice:
        return slice(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def take(self, items: np.ndarray) -> np.ndarray:
        """This shard's part of a cohort-long array."""
        return items[self.start : self.stop]


def bounds(total: int, rank: int, size: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s block when ``total`` rows are split over ``size`` ranks."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def balanced(total: int, rank: int, size: int) -> Shard:
    """Rank ``rank``'s share of a round's cohort of ``total`` rows."""
    return Shard(*bounds(total, rank, size), total)


def blocks(num_clients: int, rank: int, size: int) -> Shard:
    """Rank ``rank``'s static block of client ids ``0..num_clients-1`` for the whole run."""
    return Shard(*bounds(num_clients, rank, size), num_clients)
