"""The empirical side of the convergence theory: what the bounds talk about, measured.

:mod:`fedge.theory` turns the papers' bounds into numbers from given constants and imports nothing above
``config``. This package measures instead, from models, federated data and runs, so it sits above the
runner:

- ``objective``: the equal-weight global objective ``F = (1/m) sum_i F_i`` over a model (or a split
  model's client, server and end-to-end parts) and federated data;
- ``estimate``: the constants the bounds need (L, sigma_L^2 at a batch size, sigma_G^2, F at a point);
- ``metrics``: the squared gradient norm of the global objective for a running algorithm;
- ``from_run``: the SplitFed bound inputs of a run config, settings read and constants estimated;
- ``harness``: any registered algorithm run round by round with the gradient norm measured, and the
  oracle problem P1 posed as data and a model for it.

Import the submodules explicitly; they need torch, the engine and, for the last two, the runner.
"""
