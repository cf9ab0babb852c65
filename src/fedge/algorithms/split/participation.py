"""Who takes part in a round and with what aggregation weight (the SplitFed theory paper's Algorithm 1 and
Theorems 2 and 4; CSE-FSL Eq. 14).

A round's participants are *draws*: one row per local run. Under sampling with replacement a client
can be drawn more than once; by default each draw is an independent run (its own batch order and
server steps), or duplicates are merged into one run weighted by their multiplicity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedge.algorithms.split.config import SplitConfig
from fedge.data.federated import FederatedData
from fedge.errors import ConfigError
from fedge.rng import numpy_rng
from fedge.runtime.availability import choose


@dataclass(frozen=True)
class Draws:
    """The rows of one round: ``clients[r]`` is row r's client, ``occurrence[r]`` how many earlier rows
    hold the same client (0 for its first), ``multiplicity[r]`` how many draws row r stands for."""

    clients: np.ndarray
    occurrence: np.ndarray
    multiplicity: np.ndarray

    def __len__(self) -> int:
        return len(self.clients)


def check_participation(mode: str, count: int | None, num_clients: int) -> int:
    """Rows per round for ``mode``; a :class:`ConfigError` naming the key when impossible."""
    if mode == "full":
        return num_clients
    if count is None:
        raise ConfigError("algorithm.clients_per_round", f"required with participation={mode}")
    if mode == "without_replacement" and count > num_clients:
        raise ConfigError(
            "algorithm.clients_per_round", f"{count} distinct clients asked for but only {num_clients} exist"
        )
    return count


def draw(
    seed: int,
    round_: int,
    num_clients: int,
    mode: str,
    count: int | None,
    duplicates: str,
    online: np.ndarray | None = None,
) -> Draws:
    """The draws of round ``round_`` from the stream ``(seed, "participants", round_)``, in draw order.

    ``full`` is every client in index order; ``without_replacement`` distinct clients in the order drawn;
    ``with_replacement`` i.i.d. uniform draws (Yang et al.'s "Strategy 1", which the SplitFed theory
    paper's Theorems 2 and 4 assume). Given the ``online`` clients (:mod:`~fedge.runtime.availability`)
    the draws are among them: every one of them (``full``), or as many distinct ones as there are.
    """
    rows = check_participation(mode, count, num_clients)
    if mode == "full":
        clients = np.arange(num_clients) if online is None else online.copy()
    else:
        rng = numpy_rng(seed, "participants", round_)
        clients = choose(rng, num_clients, rows, mode == "with_replacement", online)
    if duplicates == "merge":
        unique, first, counts = np.unique(clients, return_index=True, return_counts=True)
        order = np.argsort(first)
        return Draws(unique[order], np.zeros(len(order), dtype=np.int64), counts[order])
    seen: dict[int, int] = {}
    occurrence = np.empty(len(clients), dtype=np.int64)
    for r, c in enumerate(clients.tolist()):
        occurrence[r] = seen.get(c, 0)
        seen[c] = occurrence[r] + 1
    return Draws(clients.astype(np.int64), occurrence, np.ones(len(clients), dtype=np.int64))


def aggregation_weights(
    draws: Draws, sizes: np.ndarray, weighting: str, divisor: str, num_clients: int
) -> torch.Tensor:
    """Weight of each row in the average of the client models (float64, one per row).

    ``size``: proportional to the row's training-set size times its multiplicity; ``uniform``: to its
    multiplicity alone. Divisor ``draws`` normalises to sum 1; ``all_clients`` (the theory paper's box,
    uniform weighting only) divides by the number of clients, so partial rounds shrink the model.
    """
    base = sizes.astype(np.float64) if weighting == "size" else np.ones(len(draws))
    raw = base * draws.multiplicity
    if divisor == "all_clients":
        if weighting != "uniform":
            raise ConfigError("algorithm.aggregate_divisor", "all_clients needs aggregation=uniform")
        return torch.as_tensor(raw / num_clients)
    return torch.as_tensor(raw / raw.sum())


def participants(
    seed: int, t: int, data: FederatedData, cfg: SplitConfig, online: np.ndarray | None = None
) -> tuple[Draws, torch.Tensor]:
    """Round ``t``'s draws under ``cfg``'s participation (among the ``online`` clients when given) and
    their aggregation weights."""
    m = data.num_clients
    draws = draw(seed, t, m, cfg.participation, cfg.clients_per_round, cfg.duplicates, online)
    sizes = data.client_sizes(draws.clients)
    return draws, aggregation_weights(draws, sizes, cfg.aggregation, cfg.aggregate_divisor, m)
