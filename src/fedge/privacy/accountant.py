"""Epsilon from a history of releases, and the noise multiplier a target epsilon needs, both by Google's
``dp-accounting`` library (its RDP and PLD accountants and its calibration search): fedge never
composes privacy losses or searches a noise level by hand.

A *history* is the releases that spend one guarantee (one client's, or one sample's of one client),
as a map from a release's shape (:meth:`~fedge.privacy.release.Release.shape`) to how many releases
of that shape it holds: composition is commutative, so that is all the epsilon depends on.

``rdp`` (the default) handles every sampling fedge performs, fixed-size client draws without
replacement included, and is fast enough to recompute every round; ``pld`` (privacy loss
distributions) is tighter but has no analysis of sampling without replacement, so a history that needs
one is refused in one line. docs/decisions.md says why the library and the default.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Literal

import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedge.privacy.release import shape_event

Method = Literal["rdp", "pld"]
METHODS: tuple[Method, ...] = ("rdp", "pld")
History = Mapping[tuple[Any, ...], int]
WITHOUT_REPLACEMENT = "without_replacement"
DEFAULT_ORDERS = tuple(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
"""The RDP orders every RDP epsilon is optimised over (dp-accounting's defaults)."""


class _UnconvergedOrder(logging.Filter):
    """Drops dp-accounting's warning that a fractional RDP order's series did not converge: the library
    then leaves that order out of the minimum over orders, so the epsilon is still a valid bound (from
    the other orders), and a calibration search would repeat the warning hundreds of times in a run's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_UnconvergedOrder())


class AccountingError(ValueError):
    """A history the chosen accountant cannot account (the message says why, in one line)."""


def needs_replace_one(history: History) -> bool:
    """Whether a release of ``history`` is analysed under replace-one (randomized response or
    sampling without replacement)."""
    return any(shape[0] == "randomized_response" or shape[2] == WITHOUT_REPLACEMENT for shape in history)


def make_accountant(method: Method, replace_one: bool) -> dpa.PrivacyAccountant:
    """A fresh accountant of ``method`` for the relation the history needs."""
    relation = _relation(replace_one)
    if method == "pld":
        return pld.PLDAccountant(neighboring_relation=relation)
    return rdp.RdpAccountant(neighboring_relation=relation)


def history_event(history: History) -> dpa.DpEvent:
    """The ``dp-accounting`` event of a whole history: every shape self-composed its count, composed."""
    replace_one = needs_replace_one(history)
    parts = [
        dpa.SelfComposedDpEvent(shape_event(shape, replace_one), count)
        for shape, count in sorted(history.items(), key=repr)
        if count
    ]
    return dpa.ComposedDpEvent(parts)


def epsilon(history: History, delta: float, method: Method = "rdp") -> float:
    """The epsilon at ``delta`` of ``history`` (0 for an empty one, infinity for one that holds a
    release without noise)."""
    if not any(history.values()):
        return 0.0
    if any(shape[0] == "gaussian" and shape[1] == 0.0 for shape, count in history.items() if count):
        return math.inf
    replace_one = needs_replace_one(history)
    if replace_one and any(shape[2] == "poisson" for shape, count in history.items() if count):
        raise AccountingError(
            "Poisson sampling and replace-one releases (fixed-size draws, randomized "
            "response) cannot be composed in one guarantee by the accountant"
        )
    if method == "rdp":  # RDP composes by adding each release's RDP curve: one curve per shape, cached
        total = sum(count * _rdp_curve(shape, replace_one) for shape, count in history.items() if count)
        return float(compute_epsilon(DEFAULT_ORDERS, total, delta)[0])
    accountant = make_accountant(method, replace_one)
    event = history_event(history)
    if not accountant.supports(event):
        kinds = sorted({shape[2] if shape[0] == "gaussian" else shape[0] for shape in history})
        raise AccountingError(f"the {method} accountant cannot account {', '.join(kinds)}; use rdp")
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


@lru_cache(maxsize=4096)
def _rdp_curve(shape: tuple[Any, ...], replace_one: bool) -> np.ndarray:
    """The RDP curve (at the accountant's default orders) of one release of ``shape``, as
    ``dp-accounting``'s RDP accountant computes it: a history's curve is the count-weighted sum, which is
    exactly the accountant's own composition, without recomputing each shape's curve every round."""
    accountant = rdp.RdpAccountant(neighboring_relation=_relation(replace_one))
    accountant.compose(shape_event(shape, replace_one))
    return np.asarray(accountant._rdp, dtype=np.float64)  # noqa: SLF001 - the curve the accountant sums


def _relation(replace_one: bool) -> dpa.NeighboringRelation:
    return dpa.NeighboringRelation.REPLACE_ONE if replace_one else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE


def calibrate(
    history_at: Callable[[float], History],
    target_epsilon: float,
    delta: float,
    method: Method = "rdp",
    upper: float = 1e3,
) -> float:
    """The smallest noise multiplier whose history (``history_at(multiplier)``) meets
    ``target_epsilon`` at ``delta``, by ``dp-accounting``'s calibration search; ``AccountingError`` when
    not even ``upper`` meets it."""
    probe = history_at(upper)
    if epsilon(probe, delta, method) > target_epsilon:
        raise AccountingError(f"no noise multiplier up to {upper:g} meets epsilon {target_epsilon:g}")
    replace_one = needs_replace_one(probe)
    found = dpa.calibrate_dp_mechanism(
        lambda: make_accountant(method, replace_one),
        lambda multiplier: history_event(history_at(multiplier)),
        target_epsilon,
        delta,
        dpa.LowerEndpointAndGuess(1e-3, 1.0),
        tol=1e-4,
    )
    return float(found)
