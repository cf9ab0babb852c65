"""The result type every bound evaluator returns, and the input checks they share.

A convergence bound is only a guarantee when its theorem's conditions hold (step sizes under their caps,
enough clients, a positive denominator). Evaluators therefore never raise on a failed condition: they
return a :class:`Bound` whose ``vacuous`` flag and ``reason`` say why the number guarantees nothing, while
``value`` keeps the formula's value where it is finite (useful for reading trends across a sweep).
Impossible *inputs* (a negative smoothness constant, zero rounds) are errors instead:
:class:`~fedge.errors.ConfigError` naming the argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedge.errors import ConfigError

REL_TOL = 1e-9  # a step exactly at its cap (up to rounding) satisfies the cap


@dataclass(frozen=True)
class Bound:
    """A bound's value, its additive terms, and whether it is vacuous (and why).

    ``value`` is ``+inf`` when the formula itself is infinite (e.g. a non-positive denominator);
    ``terms`` are the additive parts whose sum is ``value`` (each already divided by any common
    denominator); ``conditions`` holds the quantities the theorem's conditions compare (step caps,
    denominators), so a report can show how far a setting is from validity.
    """

    name: str
    value: float
    terms: dict[str, float] = field(default_factory=dict)
    vacuous: bool = False
    reason: str = ""
    conditions: dict[str, float] = field(default_factory=dict)

    def holds_for(self, measured: float) -> bool:
        """True when the bound is non-vacuous and ``measured`` does not exceed it."""
        return not self.vacuous and measured <= self.value

    def margin(self, measured: float) -> float:
        """``value / measured``: how many times larger the bound is than what was measured."""
        return self.value / measured if measured > 0 else math.inf


def make_bound(
    name: str, terms: dict[str, float], failures: list[str], conditions: dict[str, float] | None = None
) -> Bound:
    """A :class:`Bound` summing ``terms``; vacuous if any condition failed or the sum is not a finite,
    non-negative number (the failed conditions, then the value problem, make the reason)."""
    value = math.fsum(terms.values()) if all(math.isfinite(v) for v in terms.values()) else math.inf
    reasons = list(failures)
    if math.isnan(value) or math.isinf(value):
        value = math.inf
        reasons.append("the bound is infinite")
    elif value < 0:
        reasons.append(f"the bound is negative ({value:.4g})")
    return Bound(name, value, dict(terms), bool(reasons), "; ".join(reasons), dict(conditions or {}))


def infinite(name: str, reason: str, conditions: dict[str, float] | None = None) -> Bound:
    """A vacuous bound whose formula is infinite (e.g. a denominator ``1 - x`` with ``x >= 1``)."""
    return Bound(name, math.inf, {}, True, reason, dict(conditions or {}))


def within(step: float, cap: float) -> bool:
    """``step <= cap`` up to floating-point rounding (a step set to its cap is admissible)."""
    return step <= cap * (1.0 + REL_TOL)


def positive(key: str, value: float) -> float:
    """``value`` if it is a finite number > 0, else a ConfigError naming ``key``."""
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(key, f"must be a finite number > 0 (got {value!r})")
    return float(value)


def nonnegative(key: str, value: float) -> float:
    """``value`` if it is a finite number >= 0, else a ConfigError naming ``key``."""
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(key, f"must be a finite number >= 0 (got {value!r})")
    return float(value)


def finite(key: str, value: float) -> float:
    """``value`` if it is finite (a gap F(x0) - F_inf may be of either sign), else a ConfigError."""
    if not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number (got {value!r})")
    return float(value)


def count(key: str, value: int, minimum: int = 1) -> int:
    """``value`` if it is an integer >= ``minimum``, else a ConfigError naming ``key``."""
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ConfigError(key, f"must be an integer >= {minimum} (got {value!r})")
    return int(value)
