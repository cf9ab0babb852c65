"""Straggler-aware synchronous FedAvg and asynchronous aggregation on the simulated clock
(docs/async.md): ``fedavg_deadline``, ``fedbuff``, ``fedasync`` and ``cse_fsl_async``."""

from fedge.algorithms.asynchronous import cse_fsl, deadline, fedasync, fedbuff  # noqa: F401
