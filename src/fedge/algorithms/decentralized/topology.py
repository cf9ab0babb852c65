"""Communication graphs of decentralized FL: who can talk to whom (each client knows only its row).

A topology is a symmetric boolean adjacency matrix ``[n, n]`` with an empty diagonal. Kinds:

- ``full``: every client linked to every other (AFIND+ Tables 1, 2, 4);
- ``partial``: Erdős–Rényi with edge probability ``p`` (Table 3 uses ``p = 0.5``), redrawn until the
  graph is connected, at most ``max_retries`` draws, then a :class:`~fedge.errors.ConfigError`;
- ``ring``: client ``i`` linked to ``i - 1`` and ``i + 1`` (mod n);
- ``regular``: a random ``degree``-regular connected graph: a circulant graph (``i`` linked to the
  ``degree // 2`` nearest on each side, plus the opposite client for odd degree) randomised by
  degree-preserving double-edge swaps. The swap chain avoids the configuration model, whose rejection
  rate explodes with the degree; a disconnected result is re-randomised (bounded retries).

Every draw comes from ``numpy_rng(seed, "topology")``, so a seed fixes the graph.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, PositiveInt

from fedge.config import StrictModel
from fedge.errors import ConfigError
from fedge.rng import numpy_rng

KEY = "algorithm.topology"


class TopologyConfig(StrictModel):
    """Which graph links the clients; ``p`` is for ``partial``, ``degree`` for ``regular``."""

    kind: Literal["full", "partial", "ring", "regular"] = "full"
    """full, partial (connected Erdos-Renyi), ring or regular"""
    p: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    """partial: edge probability"""
    degree: PositiveInt = 4
    """regular: neighbours per client"""
    max_retries: PositiveInt = 100
    """redraws until the random graph is connected"""


def is_connected(adjacency: np.ndarray) -> bool:
    """Whether the undirected graph reaches every node from node 0 (true for 0 or 1 nodes)."""
    n = len(adjacency)
    if n <= 1:
        return True
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    frontier = seen.copy()
    while frontier.any():
        frontier = adjacency[frontier].any(axis=0) & ~seen
        seen |= frontier
    return bool(seen.all())


def _full(n: int) -> np.ndarray:
    return ~np.eye(n, dtype=bool)


def _partial(n: int, cfg: TopologyConfig, rng: np.random.Generator) -> np.ndarray:
    for _ in range(cfg.max_retries):
        upper = np.triu(rng.random((n, n)) < cfg.p, k=1)
        adjacency = upper | upper.T
        if is_connected(adjacency):
            return adjacency
    raise ConfigError(
        f"{KEY}.p",
        f"no connected Erdős–Rényi graph of {n} clients with p={cfg.p} in {cfg.max_retries} draws; raise p",
    )


def _ring(n: int) -> np.ndarray:
    adjacency = np.zeros((n, n), dtype=bool)
    if n > 1:
        i = np.arange(n)
        adjacency[i, (i + 1) % n] = True
        adjacency[(i + 1) % n, i] = True
    return adjacency


def _circulant(n: int, degree: int) -> np.ndarray:
    adjacency = np.zeros((n, n), dtype=bool)
    i = np.arange(n)
    for step in range(1, degree // 2 + 1):
        adjacency[i, (i + step) % n] = adjacency[(i + step) % n, i] = True
    if degree % 2:
        adjacency[i, (i + n // 2) % n] = True
    return adjacency


def _swap_edges(adjacency: np.ndarray, rng: np.random.Generator, swaps: int) -> np.ndarray:
    """Degree-preserving randomisation: replace edges (a,b), (c,d) by (a,d), (c,b) when that is simple."""
    adjacency = adjacency.copy()
    edges = [tuple(e) for e in np.argwhere(np.triu(adjacency, k=1))]
    if len(edges) < 2:
        return adjacency
    for _ in range(swaps):
        e, f = rng.choice(len(edges), size=2, replace=False)
        (a, b), (c, d) = edges[e], edges[f]
        if rng.random() < 0.5:
            c, d = d, c
        if len({a, b, c, d}) < 4 or adjacency[a, d] or adjacency[c, b]:
            continue
        adjacency[a, b] = adjacency[b, a] = adjacency[c, d] = adjacency[d, c] = False
        adjacency[a, d] = adjacency[d, a] = adjacency[c, b] = adjacency[b, c] = True
        edges[e], edges[f] = (a, d), (c, b)
    return adjacency


def _regular(n: int, cfg: TopologyConfig, rng: np.random.Generator) -> np.ndarray:
    k = cfg.degree
    if k >= n:
        raise ConfigError(f"{KEY}.degree", f"degree {k} needs more than {k} clients (got {n})")
    if (n * k) % 2:
        raise ConfigError(f"{KEY}.degree", f"no {k}-regular graph on {n} clients: n * degree must be even")
    base = _circulant(n, k)
    for _ in range(cfg.max_retries):
        adjacency = _swap_edges(base, rng, swaps=10 * n * k)
        if is_connected(adjacency):
            return adjacency
    raise ConfigError(f"{KEY}.degree", f"no connected {k}-regular graph found in {cfg.max_retries} tries")


def build_topology(cfg: TopologyConfig, num_clients: int, seed: int) -> np.ndarray:
    """The adjacency matrix (symmetric, boolean, empty diagonal) of ``cfg.kind`` on ``num_clients``."""
    rng = numpy_rng(seed, "topology")
    if cfg.kind == "full":
        return _full(num_clients)
    if cfg.kind == "partial":
        return _partial(num_clients, cfg, rng)
    if cfg.kind == "ring":
        return _ring(num_clients)
    return _regular(num_clients, cfg, rng)
