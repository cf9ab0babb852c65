"""Latency-optimal submodel sizes of HIST (Sec. IV-B, Eqs. 19-20, for OMA; Sec. V-E, Eq. 36, for AirComp).

The cloud splits ``units`` allocation units (hidden neurons of the partitioned layer) among the cells.
A cell holding ``s_j`` units holds ``shared + per_unit * s_j`` model values and its global round takes
``cost_j`` seconds per value (Eq. 19 / Eq. 36), so the problem is

    minimise max_j cost_j (shared + per_unit s_j)   s.t.  sum_j s_j = units,  minimum <= s_j <= cap,

with the cap from the convergence constraint (19c): ``eps_th = 9 delta_1^2`` gives ``d_j <= 1.5 d / N``.
The objective is a max of increasing functions of separate variables, so handing out units one at a time
to the cell that stays fastest is optimal (:func:`greedy_sizes`); :func:`milp_sizes` solves the paper's
epigraph MILP (Eq. 20) with HiGHS through ``scipy.optimize.milp``, as a reference.
"""

from __future__ import annotations

import heapq
import math

import numpy as np


def uniform_sizes(units: int, cells: int) -> np.ndarray:
    """Near-equal integer sizes (differing by at most one, the larger ones first) summing to ``units``."""
    return np.array([len(part) for part in np.array_split(np.arange(units), cells)], dtype=np.int64)


def size_cap(units: int, cells: int, ratio: float = 1.5) -> int:
    """Most units one cell may hold: ``floor(ratio * units / cells)`` from (19c), raised to
    ``ceil(units / cells)`` when the floor would make the problem infeasible."""
    return max(math.floor(ratio * units / cells), math.ceil(units / cells))


def _check(costs: np.ndarray, units: int, cap: int, minimum: int) -> None:
    cells = len(costs)
    if cells * minimum > units or cells * cap < units:
        raise ValueError(f"no sizes of {cells} cells in [{minimum}, {cap}] sum to {units}")


def greedy_sizes(
    costs: np.ndarray, units: int, cap: int, minimum: int = 1, shared: float = 0.0, per_unit: float = 1.0
) -> np.ndarray:
    """Optimal sizes: start every cell at ``minimum`` and give each next unit to the cell whose latency
    after taking it is smallest (ties to the lower cell index, so equal costs give :func:`uniform_sizes`)."""
    costs = np.asarray(costs, dtype=np.float64)
    _check(costs, units, cap, minimum)
    sizes = np.full(len(costs), minimum, dtype=np.int64)
    heap = [(c * (shared + per_unit * (minimum + 1)), j) for j, c in enumerate(costs) if minimum < cap]
    heapq.heapify(heap)
    for _ in range(units - int(sizes.sum())):
        _, j = heapq.heappop(heap)
        sizes[j] += 1
        if sizes[j] < cap:
            heapq.heappush(heap, (costs[j] * (shared + per_unit * (sizes[j] + 1)), j))
    return sizes


def milp_sizes(
    costs: np.ndarray, units: int, cap: int, minimum: int = 1, shared: float = 0.0, per_unit: float = 1.0
) -> np.ndarray:
    """Sizes from the epigraph MILP (Eq. 20): min ``tau`` s.t. ``cost_j (shared + per_unit s_j) <= tau``."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    costs = np.asarray(costs, dtype=np.float64)
    _check(costs, units, cap, minimum)
    cells = len(costs)
    objective = np.r_[np.zeros(cells), 1.0]
    epigraph = np.hstack([np.diag(costs * per_unit), -np.ones((cells, 1))])
    total = np.r_[np.ones(cells), 0.0][None, :]
    constraints = [
        LinearConstraint(epigraph, -np.inf, -costs * shared),
        LinearConstraint(total, units, units),
    ]
    bounds = Bounds(np.r_[np.full(cells, minimum), 0.0], np.r_[np.full(cells, cap), np.inf])
    result = milp(objective, constraints=constraints, integrality=np.r_[np.ones(cells), 0.0], bounds=bounds)
    if not result.success:
        raise RuntimeError(f"MILP failed: {result.message}")
    return np.rint(result.x[:cells]).astype(np.int64)


def round_latency(costs: np.ndarray, sizes: np.ndarray, shared: float = 0.0, per_unit: float = 1.0) -> float:
    """The objective: ``max_j cost_j (shared + per_unit s_j)``."""
    return float(np.max(np.asarray(costs) * (shared + per_unit * np.asarray(sizes, dtype=np.float64))))
