"""Split-learning family: SplitFed v1/v2 (FSL_MC/FSL_OC), FSL_AN and CSE-FSL (one module per algorithm).

The round itself lives once in :mod:`~fedge.algorithms.split.protocol`; each algorithm module declares
its config and whether it has an aux head and server copies.
"""

from fedge.algorithms.split import cse_fsl, fsl_an, splitfed_v1, splitfed_v2  # noqa: F401  (registration)
from fedge.algorithms.split.protocol import SplitLearning

__all__ = ["SplitLearning"]
