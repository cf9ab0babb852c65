"""Algorithms, one module each, registered by name with their own config class."""

import fedge.algorithms.asynchronous  # noqa: F401
from fedge.algorithms import centralized, decentralized, fedavg, hierarchical, split  # noqa: F401
from fedge.algorithms.base import ALGORITHMS, Algorithm, Context, register

__all__ = ["ALGORITHMS", "Algorithm", "Context", "register"]
