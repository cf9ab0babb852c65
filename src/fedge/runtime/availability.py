"""Availability-aware participant sampling: the seam through which every synchronous algorithm that
samples a round's participants (FedAvg and its fine-tuned variant, the split family's ``participation``)
skips the clients that are offline.

With device profiles that can take a client offline (``system.devices``: an ``availability`` below 1, an
availability ``trace`` or an ``energy_budget_j``), the participants of round ``t`` are drawn among the
clients :meth:`~fedge.system.SystemModel.online` in it (the draw ``(seed, "availability", t)`` or the
trace's row, and the budgets). When every client is online (always, without profiles) the draw is the
one the algorithm always made, number for number.
"""

from __future__ import annotations

import numpy as np

from fedge.rng import numpy_rng
from fedge.system import SystemModel


def online_clients(system: SystemModel, round_: int) -> np.ndarray | None:
    """The clients online in ``round_`` (sorted), or None when every client is."""
    online = system.online(round_)
    return None if online.all() else np.flatnonzero(online)


def choose(
    rng: np.random.Generator, num_clients: int, size: int, replace: bool, online: np.ndarray | None
) -> np.ndarray:
    """``size`` clients from ``rng``: among all ``num_clients`` (``online`` None, the draw as it always
    was), or among ``online`` (without replacement at most all of them; none when nobody is online)."""
    if online is None:
        return rng.choice(num_clients, size=size, replace=replace)
    if not len(online):
        return np.zeros(0, dtype=np.int64)
    return rng.choice(online, size=size if replace else min(size, len(online)), replace=replace)


def draw_clients(seed: int, pool: np.ndarray, count: int, *keys: int) -> np.ndarray:
    """``count`` clients of ``pool`` (all of it if it has no more), sorted, from the stream
    ``(seed, "participants", *keys)``: with the whole population as the pool, FedAvg's own draw."""
    pool = np.asarray(pool, dtype=np.int64)
    if count >= len(pool):
        return pool.copy()
    return np.sort(numpy_rng(seed, "participants", *keys).choice(pool, size=count, replace=False))


def idle_online(system: SystemModel, draw: int, busy: set[int]) -> np.ndarray:
    """The clients online at availability draw ``draw`` (1-based) and not in ``busy``: who an
    asynchronous server may dispatch to (one draw per dispatch)."""
    online = system.online(draw)
    online[list(busy)] = False
    return np.flatnonzero(online)
