"""Split-learning family: SplitFed v1/v2 (FSL_MC/FSL_OC), FSL_AN, CSE-FSL and FSL-SAGE (one module per
algorithm).

The round itself lives once in :mod:`~fedge.algorithms.split.protocol`; each algorithm module declares
its config and whether it has an aux head and server copies. Lightweight FedSL (``light_fedsl``) and
its baseline ``fedsl`` step every client one batch per round (both in
:mod:`~fedge.algorithms.split.light_fedsl`).
"""

from fedge.algorithms.split import (  # noqa: F401  (registration)
    cse_fsl,
    fsl_an,
    fsl_sage,
    light_fedsl,
    splitfed_v1,
    splitfed_v2,
)
from fedge.algorithms.split.protocol import SplitLearning

__all__ = ["SplitLearning"]
