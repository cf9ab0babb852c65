"""Convergence bounds of CSE-FSL (Mu & Shen; Sec. V-A): Propositions 1 (client) and 2 (server).

Setting of the paper's analysis: iid local data, all n clients every round, aggregation every round; one
round is h local steps per client followed by n sequential server steps. Both bound the average over
rounds ``(1/T) sum_t E||grad F||^2`` and are stated only for their prescribed constant step sizes,
``eta = 1/(L h sqrt T)`` (client) and ``eta = 1/(L n sqrt T)`` (server); G1^2 and G2^2 bound the
second moment of the stochastic gradients. The server bound has a term in the clients' feature drift
``sum_t sum_i d_{c,i}^t``, which does not shrink with sqrt(T).
"""

from __future__ import annotations

import math

from fedge.theory.bound import Bound, count, finite, make_bound, nonnegative, positive

STEP_TOL = 1e-9


def client_step(L: float, h: int, T: int) -> float:
    """Proposition 1's step size ``1/(L h sqrt T)``."""
    return 1.0 / (L * h * math.sqrt(T))


def server_step(L: float, n: int, T: int) -> float:
    """Proposition 2's step size ``1/(L n sqrt T)``."""
    return 1.0 / (L * n * math.sqrt(T))


def _step_failures(eta: float | None, prescribed: float, side: str) -> list[str]:
    if eta is None or abs(eta - prescribed) <= STEP_TOL * prescribed:
        return []
    return [f"{side} step {eta:.4g} is not the proposition's prescribed {prescribed:.4g}"]


def prop1(*, L: float, G1_sq: float, h: int, T: int, delta_F: float, eta: float | None = None) -> Bound:
    """Proposition 1 (client side): ``4 L h dF / ((2h-1) sqrt T) + 2 h G1^2 / ((2h-1) sqrt T)``.

    ``eta`` (optional) is the step actually used; the bound is vacuous unless it is the prescribed one.
    """
    L, G1_sq, dF = positive("L", L), nonnegative("G1_sq", G1_sq), finite("delta_F", delta_F)
    h, T = count("h", h), count("T", T)
    prescribed = client_step(L, h, T)
    root = (2 * h - 1) * math.sqrt(T)
    terms = {"optimisation": 4 * L * h * dF / root, "second_moment": 2 * h * G1_sq / root}
    return make_bound("cse_fsl.prop1", terms, _step_failures(eta, prescribed, "client"), {"eta": prescribed})


def prop2(
    *,
    L: float,
    G2_sq: float,
    n: int,
    T: int,
    delta_F: float,
    drift_sum: float = 0.0,
    eta: float | None = None,
) -> Bound:
    """Proposition 2 (server side): Prop. 1's form with n in place of h, plus the feature-drift term
    ``4 G2^2 / ((2n-1) T) * sum_t sum_i d_{c,i}^t`` (``drift_sum``; 0 when the client features do not
    move, e.g. a frozen client). The paper's ``F_c(x_s*)`` in the first numerator is read as F_s."""
    L, G2_sq, dF = positive("L", L), nonnegative("G2_sq", G2_sq), finite("delta_F_server", delta_F)
    n, T, drift_sum = count("n", n), count("T", T), nonnegative("drift_sum", drift_sum)
    prescribed = server_step(L, n, T)
    root = (2 * n - 1) * math.sqrt(T)
    terms = {
        "optimisation": 4 * L * n * dF / root,
        "feature_drift": 4 * G2_sq * drift_sum / ((2 * n - 1) * T),
        "second_moment": 2 * n * G2_sq / root,
    }
    return make_bound("cse_fsl.prop2", terms, _step_failures(eta, prescribed, "server"), {"eta": prescribed})
