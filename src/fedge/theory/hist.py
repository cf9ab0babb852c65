"""Convergence bounds of HIST (Fang, Han, Brinton; Secs. III and V-C): Theorems 1 (OMA) and 2 (AirComp).

Both bound ``(1/(TE)) sum_t sum_e E||grad f(xhat^{t,e})||^2`` for N >= 2 cells with n_j clients each,
E edge rounds of H local steps per global round and one step size gamma, under the Eq. 13 step condition.
Two terms do not vanish as T grows (the mask term ``6 (N/d) avg_t d_max^t delta_1^2`` and the model-norm
term ``48 (N-1) L^2 avg_t E||xbar^t||^2``): the guarantee is a neighbourhood of a stationary point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedge.theory.bound import Bound, count, finite, make_bound, nonnegative, positive, within


def n_tilde(clients_per_cell: Sequence[int]) -> float:
    """``Ntilde = sum_j 1/n_j``."""
    return sum(1.0 / count(f"clients_per_cell[{j}]", n) for j, n in enumerate(clients_per_cell))


def gamma_max(N: int, E: int, H: int, L: float, Ntilde: float) -> float:
    """Eq. 13: ``min{1/(45 sqrt(N) E H L), Ntilde/(N H L), 1/(N H^2 L), 1/(N (N+1) E^2 H^2 L)}``."""
    return min(
        1.0 / (45.0 * math.sqrt(N) * E * H * L),
        Ntilde / (N * H * L),
        1.0 / (N * H * H * L),
        1.0 / (N * (N + 1) * E * E * H * H * L),
    )


def corollary_gamma(T: int, E: int, H: int, Ntilde: float) -> float:
    """Corollaries 1-2's step ``(T E H Ntilde)^(-1/2)`` (valid once T is large enough for Eq. 13)."""
    return 1.0 / math.sqrt(T * E * H * Ntilde)


def thm1(
    *,
    L: float,
    gamma: float,
    T: int,
    E: int,
    H: int,
    clients_per_cell: Sequence[int],
    sigma2: float,
    delta1_sq: float,
    delta2_sq: float,
    d: int,
    d_max_avg: float,
    model_sq_avg: float,
    delta_f: float,
    aircomp_mse: float | None = None,
) -> Bound:
    """Theorem 1 (Eq. 14), or Theorem 2 (Eq. 29) when ``aircomp_mse`` is given.

    ``d_max_avg`` = ``(1/T) sum_t max_j ||p_j^t||_1`` (``d/N`` for equal uniform masks),
    ``model_sq_avg`` = ``(1/T) sum_t E||xbar^t||^2``, ``delta_f`` = ``f(xbar^0) - f_*``, and
    ``aircomp_mse`` = ``(1/(TE)) sum_t sum_e sum_j MSE_j^{t,e}`` (AirComp aggregation error).
    """
    L, gamma, delta_f = positive("L", L), positive("gamma", gamma), finite("delta_f", delta_f)
    T, E, H, d = count("T", T), count("E", E), count("H", H), count("d", d)
    sigma2, delta1_sq, delta2_sq = (
        nonnegative(k, v) for k, v in (("sigma2", sigma2), ("delta1_sq", delta1_sq), ("delta2_sq", delta2_sq))
    )
    d_max_avg, model_sq_avg = nonnegative("d_max_avg", d_max_avg), nonnegative("model_sq_avg", model_sq_avg)
    N = len(clients_per_cell)
    nt = n_tilde(clients_per_cell)
    terms = {
        "optimisation": 4 * delta_f / (gamma * T * E * H),
        "noise": 100 * gamma * nt * L * sigma2,
        "inter_cell": 1356 * gamma * L * delta1_sq,
        "intra_cell": 60 * gamma * L * delta2_sq,
        "mask": 6 * (N / d) * d_max_avg * delta1_sq,
        "model_norm": 48 * (N - 1) * L**2 * model_sq_avg,
    }
    name = "hist.thm1"
    if aircomp_mse is not None:
        terms["aircomp"] = gamma * nonnegative("aircomp_mse", aircomp_mse)
        name = "hist.thm2"
    failures = []
    cap = gamma_max(N, E, H, L, nt) if N >= 1 else math.nan
    if N < 2:
        failures.append(f"needs N >= 2 cells (got {N})")
    elif not within(gamma, cap):
        failures.append(f"step gamma={gamma:.4g} exceeds the Eq. 13 cap {cap:.4g}")
    return make_bound(name, terms, failures, {"gamma_cap": cap, "Ntilde": nt})
