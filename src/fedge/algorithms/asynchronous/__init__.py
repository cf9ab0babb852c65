"""Straggler-aware synchronous FedAvg and asynchronous aggregation on the simulated clock
(docs/async.md): ``fedavg_deadline``, ``fedbuff`` and ``fedasync``."""

from fedge.algorithms.asynchronous import deadline, fedasync, fedbuff  # noqa: F401
