"""Algorithms, one module each, registered by name with their own config class."""

from fedge.algorithms import centralized, decentralized, fedavg, split  # noqa: F401  (registration)
from fedge.algorithms.base import ALGORITHMS, Algorithm, Context, register

__all__ = ["ALGORITHMS", "Algorithm", "Context", "register"]
