"""Convergence bounds of non-iid SplitFed / CSE-FSL with partial participation (the SplitFed theory paper).

Theorems 1-2 bound the client side (``min_t E||grad F^c(xbarC^t)||^2`` over rounds ``t = 0 mod l``),
Theorems 3-4 the server side, in terms of the shared constants L, sigma_L^2 (local noise) and sigma_G^2
(heterogeneity), the client step ``a`` (mu_L), the per-sequential-step server step ``mu``, K local steps,
the server interval ``l``, m clients, n draws per round (with replacement) and T rounds.

Where the paper's text is inconsistent we evaluate each reading and default to the one that is a valid
bound (docs/decisions.md, "Convergence bounds"): Thm 2 "corrected" (the last proof step of Appendix A.1
divides every term by D'), Thm 3 with the appendix cap mu <= 1/(8 L m^2) (Theorem A3; the main text says
1/(2L)), Thm 4 "as stated" (with m, and the cap 1/(8 L^2 m^2)) next to its "n-substituted" sanity variant.
Every bound is evaluated even when a condition fails (then ``vacuous`` is set and ``reason`` names the
condition); a non-positive denominator D = 1 - Gamma*lam2 makes it +inf.
"""

# ruff: noqa: E741  (``l`` is the paper's server interval; the formulas keep its symbols)
from __future__ import annotations

import math
from typing import Literal

from fedge.errors import ConfigError
from fedge.theory.bound import Bound, count, finite, infinite, make_bound, nonnegative, positive, within

Thm2Variant = Literal["corrected", "stated"]
Thm3Cap = Literal["appendix", "main_text"]
Thm4Variant = Literal["stated", "n_substituted"]
Thm4Cap = Literal["stated", "dimensional"]


def a_max(L: float, K: int, l: int) -> float:
    """Theorems 1-2's client step cap ``1 / (l L K 2^(1.15 l + 1.85))``."""
    return 1.0 / (l * L * K * 2.0 ** (1.15 * l + 1.85))


def corollary_client_step(L: float, K: int, l: int, T: int) -> float:
    """Corollaries 1-2's step rule ``a_max / sqrt(T)`` (gives O(l / sqrt T), constant ~ l 2^(1.15 l))."""
    return a_max(L, K, l) / math.sqrt(T)


def thm3_step_cap(L: float, m: int, cap: Thm3Cap = "appendix") -> float:
    """Theorem 3's server step cap: appendix ``1/(8 L m^2)`` (default; the only one that makes the final
    simplification valid, Theorem A3) or main text ``1/(2L)``."""
    return 1.0 / (8.0 * L * m * m) if cap == "appendix" else 1.0 / (2.0 * L)


def thm4_step_cap(L: float, m: int, cap: Thm4Cap = "stated") -> float:
    """Theorem 4's server step cap: as stated ``1/(8 L^2 m^2)`` (default) or the dimensionally
    consistent ``1/(8 L m^2)``."""
    return 1.0 / (8.0 * L * L * m * m) if cap == "stated" else 1.0 / (8.0 * L * m * m)


def corollary_server_step(L: float, m: int, T: int, theorem: Literal[3, 4] = 3) -> float:
    """Corollary 3's ``1/(L m^2 sqrt T)`` (appendix) or Corollary 4's ``1/(L^2 m^2 sqrt T)``."""
    scale = L if theorem == 3 else L * L
    return 1.0 / (scale * m * m * math.sqrt(T))


def _power(base: float, exponent: int) -> float:
    try:
        return base**exponent
    except OverflowError:
        return math.inf


def _recursion(L: float, sL2: float, sG2: float, a: float, K: int, l: int) -> tuple[float, float]:
    """``(lam1, lam2)`` of the drift recursion over the l rounds between server rounds (Theorem A1)."""
    A = 8 * L**2 * a**2 * (K**2 + 30 * L**2 * K**3 * a**2) + 2
    B = 8 * L**2 * a**2 * ((K**2 + 5 * L**2 * K**3 * a**2) * sL2 + (K**2 + 30 * L**2 * K**4 * a**2) * sG2)
    geometric = (_power(A, l) - 1) / (A - 1)
    lam2 = geometric
    lam1 = B * (geometric - l) / (A - 1)
    return lam1, lam2


def _client_inputs(L, sigma_L2, sigma_G2, delta_F, a, K, l, T) -> tuple:
    return (
        positive("L", L),
        nonnegative("sigma_L2", sigma_L2),
        nonnegative("sigma_G2", sigma_G2),
        finite("delta_F", delta_F),
        positive("mu_L", a),
        count("K", K),
        count("l", l),
        count("T", T),
    )


def thm1(
    *, L: float, sigma_L2: float, sigma_G2: float, delta_F: float, a: float, K: int, l: int, T: int
) -> Bound:
    """Theorem 1: client side, full participation (Theorem A1).

    Vacuous when ``a > a_max(L, K, l)`` or ``D = 1 - Gamma*lam2 <= 0`` (then +inf; at the maximal step
    and l = 1 this happens for K < 8).
    """
    L, sL2, sG2, dF, a, K, l, T = _client_inputs(L, sigma_L2, sigma_G2, delta_F, a, K, l, T)
    name = "sfl.thm1"
    cap = a_max(L, K, l)
    failures = [] if within(a, cap) else [f"client step mu_L={a:.4g} exceeds a_max={cap:.4g}"]
    lam1, lam2 = _recursion(L, sL2, sG2, a, K, l)
    gamma = 4 * (L * a + a**2 * K * L**2 * (l - 1)) * (K + 30 * L**2 * K**2 * a**2) + 30 * K**2 * a**2 * L**2
    D = 1 - gamma * lam2
    conditions = {"a_max": cap, "Gamma*lam2": gamma * lam2, "D": D}
    if not D > 0:
        return infinite(name, "; ".join([*failures, f"D = 1 - Gamma*lam2 = {D:.4g} <= 0"]), conditions)
    noise = (
        5 * K * a**2 * L**2 * (sL2 + 6 * K * sG2)
        + (4 * L * a + 4 * a**2 * K * L**2 * (l - 1))
        * ((K * l + 5 * L**2 * K**2 * l * a**2) * sL2 + (K * l + 30 * L**2 * K**3 * l * a**2) * sG2)
    ) / D
    terms = {
        "optimisation": 2 * dF / (D * a * K * T),
        "noise": noise,
        "drift_recursion": gamma * lam1 / D,
    }
    return make_bound(name, terms, failures, conditions)


def thm2(
    *,
    L: float,
    sigma_L2: float,
    sigma_G2: float,
    delta_F: float,
    a: float,
    K: int,
    l: int,
    T: int,
    n: int,
    variant: Thm2Variant = "corrected",
) -> Bound:
    """Theorem 2: client side, n draws per round with replacement (Theorem A2).

    ``corrected`` divides every term by D' (what the proof's last step gives; default);
    ``stated`` divides only the recursion term, as printed. n enters only through ``L a sigma_L^2 / n``.
    """
    L, sL2, sG2, dF, a, K, l, T = _client_inputs(L, sigma_L2, sigma_G2, delta_F, a, K, l, T)
    n = count("n", n)
    if variant not in ("corrected", "stated"):
        raise ConfigError("variant", f"Theorem 2 variant must be 'corrected' or 'stated' (got {variant!r})")
    name = f"sfl.thm2.{variant}"
    cap = a_max(L, K, l)
    failures = [] if within(a, cap) else [f"client step mu_L={a:.4g} exceeds a_max={cap:.4g}"]
    lam1, lam2 = _recursion(L, sL2, sG2, a, K, l)
    gamma = (
        4 * a**2 * L**2 * (K**2 * l + 30 * L**2 * K**3 * l * a**2)
        + (L * a / l) * (90 * l * K**3 * L**2 * a**2 + 3 * K)
        + 30 * K**2 * a**2 * L**2
    )
    D = 1 - gamma * lam2
    conditions = {"a_max": cap, "Gamma'*lam2": gamma * lam2, "D'": D}
    if not D > 0:
        return infinite(name, "; ".join([*failures, f"D' = 1 - Gamma'*lam2 = {D:.4g} <= 0"]), conditions)
    c_local = (
        5 * K * a**2 * L**2
        + 4 * a**2 * L**2 * (K**2 * l**2 + 5 * L**2 * K**3 * l**2 * a**2)
        + L * a * (1 / n + 15 * K**2 * L**2 * a**2)
    )
    c_global = (
        30 * K**2 * a**2 * L**2
        + L * a * (90 * K**3 * L**2 * a**2 + 3 * K)
        + 4 * a**2 * L**2 * (K**2 * l**2 + 30 * L**2 * K**4 * l**2 * a**2)
    )
    scale = 1 / D if variant == "corrected" else 1.0
    terms = {
        "optimisation": scale * 2 * dF / (a * K * T),
        "local_noise": scale * c_local * sL2,
        "heterogeneity": scale * c_global * sG2,
        "drift_recursion": gamma * lam1 / D,
    }
    return make_bound(name, terms, failures, conditions)


def _server_inputs(L, sigma_L2, sigma_G2, delta_F, mu, l, T) -> tuple:
    return (
        positive("L", L),
        nonnegative("sigma_L2", sigma_L2),
        nonnegative("sigma_G2", sigma_G2),
        finite("delta_F_server", delta_F),
        positive("mu", mu),
        count("l", l),
        count("T", T),
    )


def _server_step_failures(mu: float, step_cap: float, cap: str) -> list[str]:
    return [] if within(mu, step_cap) else [f"server step mu={mu:.4g} exceeds the {cap} cap {step_cap:.4g}"]


def thm3(
    *,
    L: float,
    sigma_L2: float,
    sigma_G2: float,
    delta_F: float,
    mu: float,
    m: int,
    l: int,
    T: int,
    cap: Thm3Cap = "appendix",
) -> Bound:
    """Theorem 3: server side, full participation, m >= 2 (Theorem A3); ``mu`` is the per-step size."""
    L, sL2, sG2, dF, mu, l, T = _server_inputs(L, sigma_L2, sigma_G2, delta_F, mu, l, T)
    m = count("m", m)
    name = "sfl.thm3"
    step_cap = thm3_step_cap(L, m, cap)
    conditions = {"mu_cap": step_cap}
    failures = _server_step_failures(mu, step_cap, cap)
    if m < 2:
        return infinite(name, "; ".join([*failures, "needs m >= 2 (2m - 3 > 0)"]), conditions)
    terms = {
        "optimisation": 2 * l * dF / (mu * (2 * m - 3) * T),
        "noise": L * mu * m**2 * (9.2 * sL2 + 13.2 * sG2) / (2 * m - 3),
    }
    return make_bound(name, terms, failures, conditions)


def thm4(
    *,
    L: float,
    sigma_L2: float,
    sigma_G2: float,
    delta_F: float,
    mu: float,
    m: int,
    n: int,
    l: int,
    T: int,
    variant: Thm4Variant = "stated",
    cap: Thm4Cap = "stated",
) -> Bound:
    """Theorem 4: server side, n draws per round with replacement (Theorem A4).

    ``stated`` uses m as printed (the bound then has no n; m >= 3); ``n_substituted`` puts back the n of
    the proof's descent term (n >= 3) and checks the cap with n as well. The paper's replacement of n by
    m is not a valid upper-bounding step when n < m: compare both against measurements.
    """
    L, sL2, sG2, dF, mu, l, T = _server_inputs(L, sigma_L2, sigma_G2, delta_F, mu, l, T)
    m, n = count("m", m), count("n", n)
    if variant not in ("stated", "n_substituted"):
        raise ConfigError("variant", f"Theorem 4 variant must be stated or n_substituted (got {variant!r})")
    name = f"sfl.thm4.{variant}"
    size = m if variant == "stated" else n
    step_cap = thm4_step_cap(L, size, cap)
    conditions = {"mu_cap": step_cap}
    failures = _server_step_failures(mu, step_cap, cap)
    if size < 3:
        symbol = "m" if variant == "stated" else "n"
        return infinite(name, "; ".join([*failures, f"needs {symbol} >= 3 ({symbol} - 2 > 0)"]), conditions)
    terms = {
        "optimisation": l * dF / (mu * (size - 2) * T),
        "noise": 7 * L * mu * size**2 * (sL2 + sG2) / (size - 2),
    }
    return make_bound(name, terms, failures, conditions)


def client_drift_bound(*, a: float, K: int, sigma_L2: float, sigma_G2: float, grad_sq: float) -> float:
    """The unrolled Reddi lemma the client proofs use: the mean squared distance of a local iterate from
    the round's broadcast model is at most ``5 K a^2 (sL2 + 6 K sG2) + 30 K^2 a^2 ||grad F^c||^2``
    (valid for a <= 1/(8 L K))."""
    return 5 * K * a**2 * (sigma_L2 + 6 * K * sigma_G2) + 30 * K**2 * a**2 * grad_sq


def server_drift_bound(*, mu: float, m: int, sigma_L2: float, sigma_G2: float, grad_sq: float) -> float:
    """The server proofs' sequential-drift lemma: the mean squared distance of the intermediate server
    iterates from the pass's start is at most ``16 (m + 2 m^2) mu^2 (sL2 + sG2 + ||grad F^s||^2)``."""
    return 16 * (m + 2 * m * m) * mu**2 * (sigma_L2 + sigma_G2 + grad_sq)


def thm1_leading(
    *, L: float, sigma_L2: float, sigma_G2: float, delta_F: float, a: float, K: int, l: int, T: int
) -> float:
    """Theorem 1 to leading order in small steps (our expansion): ``2 dF/(eta T) + 4 L eta l (sL2 + sG2)``
    with ``eta = a K``. Not a guarantee: a trend predictor where the rigorous bound is vacuous (practical
    step sizes are far above a_max); it depends on K only through eta and not on m."""
    eta = a * K
    return 2 * delta_F / (eta * T) + 4 * L * eta * l * (sigma_L2 + sigma_G2)


def thm2_leading(
    *, L: float, sigma_L2: float, sigma_G2: float, delta_F: float, a: float, K: int, n: int, T: int
) -> float:
    """Theorem 2 to leading order (our expansion): ``2 dF/(a K T) + L a sL2 / n + 3 L a K sG2``: only the
    local-noise part shrinks with n; the heterogeneity part grows with eta = a K. Not a guarantee."""
    return 2 * delta_F / (a * K * T) + L * a * sigma_L2 / n + 3 * L * a * K * sigma_G2
