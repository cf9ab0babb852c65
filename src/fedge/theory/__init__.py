"""Convergence theory made computable: the papers' bounds as pure functions of numbers.

``sfl``, ``cse_fsl``, ``light_fedsl`` and ``hist`` evaluate each paper's bounds and return :class:`Bound`;
``inputs`` reads a ``theory:`` block per paper; ``oracle`` is P1, a problem whose constants are known
exactly, with a reference simulator of the analysed algorithm; ``validate`` pairs bounds with P1
measurements. Nothing here imports above ``config`` and ``rng``: estimating constants from models and
data, and measuring gradient norms during runs, is :mod:`fedge.empirical`'s job.
"""

from fedge.theory import cse_fsl, hist, light_fedsl, sfl
from fedge.theory.bound import Bound

__all__ = ["Bound", "cse_fsl", "hist", "light_fedsl", "sfl"]
