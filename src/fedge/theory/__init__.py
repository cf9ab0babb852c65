"""Convergence theory made computable: the papers' bounds as pure functions (``sfl``, ``cse_fsl``,
``light_fedsl``, ``hist``) returning :class:`Bound`; the constants' estimators, the run metrics, the
oracle problem P1 and the measurement harness live in the submodules ``estimate``, ``metrics``,
``oracle``, ``harness`` and ``validate`` (import them explicitly; they need the engine and the runner).
"""

from fedge.theory import cse_fsl, hist, light_fedsl, sfl
from fedge.theory.bound import Bound

__all__ = ["Bound", "cse_fsl", "hist", "light_fedsl", "sfl"]
