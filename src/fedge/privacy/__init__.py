"""Privacy as a run's third ledger: releases of private quantities, the epsilon they spend (by an
established accountant), and the mechanisms that make them (clipping and noise in the aggregation
pipeline and the local step, randomized response for labels, secure aggregation)."""

from fedge.privacy.accountant import METHODS, AccountingError, Method, calibrate, epsilon
from fedge.privacy.ledger import PrivacyLedger
from fedge.privacy.release import GAUSSIAN, RANDOMIZED_RESPONSE, Release

__all__ = [
    "GAUSSIAN",
    "METHODS",
    "RANDOMIZED_RESPONSE",
    "AccountingError",
    "Method",
    "PrivacyLedger",
    "Release",
    "calibrate",
    "epsilon",
]
