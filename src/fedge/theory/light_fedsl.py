"""Convergence bound of lightweight FedSL (Zhang, Ni, Wang; Sec. III): Theorem 1.

The bound is on ``(1/T) sum_t E||grad F(w_t)||^2`` of the concatenated split model, with per-layer
constants (sigma_l^2 noise, G_l^2 second moment, W_l^2 model norm, J_l^2 quantization error) over the L
layers, of which the first Lc are on the client. It holds for ``0 < eta <= 1/(2 beta)`` and has terms
that do not vanish as T grows (G^2/eta, W^2/eta): it bounds a neighbourhood, not convergence. K (the
number of clients) enters only through sigma^2/K and beta/K.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedge.errors import ConfigError
from fedge.theory.bound import Bound, count, finite, make_bound, nonnegative, positive, within


def step_cap(beta: float) -> float:
    """Theorem 1's step condition ``eta <= 1/(2 beta)``."""
    return 1.0 / (2.0 * beta)


def quantization_error(size: int, g_max: float, g_min: float, bits: int | None) -> float:
    """Assumption 6's bound on ``E||Q(g) - g||^2`` for a q-bit stochastic quantizer of ``size`` values
    spanning ``[g_min, g_max]``: ``(Delta_g / (2^q - 1))^2`` with ``Delta_g = sqrt(size/4)(g_max - g_min)``;
    0 without quantization (``bits=None``)."""
    if bits is None:
        return 0.0
    count("bits", bits)
    return size * (g_max - g_min) ** 2 / (4.0 * (2**bits - 1) ** 2)


def _layers(key: str, values: Sequence[float], length: int) -> list[float]:
    if len(values) != length:
        raise ConfigError(key, f"needs one value per layer ({length}), got {len(values)}")
    return [nonnegative(f"{key}[{i}]", v) for i, v in enumerate(values)]


def thm1(
    *,
    beta: float,
    eta: float,
    T: int,
    K: int,
    I: int,  # noqa: E741  (the paper's name for the aggregation interval)
    Lc: int,
    rho_f: float,
    sigma2: Sequence[float],
    G2: Sequence[float],
    W2: Sequence[float],
    J2: Sequence[float],
    theta: float,
) -> Bound:
    """Theorem 1 (Eq. 21): per-layer lists ``sigma2``, ``G2``, ``W2`` cover all L
    layers; ``J2`` (quantization error) covers the Lc client layers. ``theta = F(w_1) - F(w*)``."""
    beta, eta, theta = positive("beta", beta), positive("eta", eta), finite("theta", theta)
    T, K, I = count("T", T), count("K", K), count("I", I)  # noqa: E741
    layers = len(sigma2)
    Lc = count("Lc", Lc)
    if Lc > layers:
        raise ConfigError("Lc", f"the cut ({Lc}) is beyond the number of layers ({layers})")
    if not 0.0 <= rho_f < 1.0:
        raise ConfigError("rho_f", f"must be in [0, 1) (got {rho_f!r})")
    s2, g2, w2 = (_layers(k, v, layers) for k, v in (("sigma2", sigma2), ("G2", G2), ("W2", W2)))
    j2 = _layers("J2", J2, Lc)
    b2 = 4 * beta**2 + 1
    terms = {
        "optimisation": 2 * theta / (eta * T),
        "noise": beta * eta / K * (sum(s2) + sum(s2[:Lc])),
        "second_moment": sum(g2) / eta,
        "model_norm": 4 * b2 / eta * sum(w2),
        "aggregation": b2 * (8 * eta**2 * (I + 1) ** 2 + 1) / eta * sum(g2[:Lc]),
        "pruning": rho_f * (4 * K * beta**2 + K + beta) / (K * eta) * sum(w2[:Lc]),
        "quantization": 4 / eta * sum(j2),
    }
    cap = step_cap(beta)
    failures = [] if within(eta, cap) else [f"step eta={eta:.4g} exceeds 1/(2 beta)={cap:.4g}"]
    return make_bound("light_fedsl.thm1", terms, failures, {"eta_cap": cap})
