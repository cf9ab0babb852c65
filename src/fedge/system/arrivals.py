"""The critical path of an asynchronous server's round: the job whose arrival closed it.

An asynchronous round (one aggregation) lasts from the server's time when it began to its time at the
merge. Its seconds are split by phase along the job of the update that closed it, so that the clock's
breakdown adds up to the round like a synchronous round's does. Two servers, two rules:

- :func:`arrival_path` (FedBuff, FedAsync: the merge happens at the closing arrival): the closing job's
  download, compute and upload, each counted for the part of it inside the round, and as ``wait`` the
  time before the job started;
- :func:`merge_path` (asynchronous CSE-FSL: the merge also waits for the shared server's backlog): the
  closing job's phases in proportion to the share of the job inside the round, the server's compute
  after the arrival, and the rest as ``wait``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedge.system.clock import CLIENT_COMPUTE, DOWNLINK, SERVER_COMPUTE, UPLINK, WAIT, RoundCost

JOB_PHASES = (DOWNLINK, CLIENT_COMPUTE, UPLINK)
"""A client job's phases, in order."""


def arrival_path(began: float, now: float, start: float, phase_seconds: Sequence[float]) -> RoundCost:
    """The round ``[began, now]`` closed by a job that started at ``start`` and spent ``phase_seconds``
    in :data:`JOB_PHASES` (no energy: the jobs' joules are charged as they arrive)."""
    path: dict[str, float] = {}
    if start > began:
        path[WAIT] = start - began
    lo = start
    for phase, seconds in zip(JOB_PHASES, phase_seconds, strict=True):
        inside = min(lo + seconds, now) - max(lo, began)
        lo += seconds
        if inside > 0:
            path[phase] = inside
    return RoundCost(now - began, 0.0, path, {})


def merge_path(
    began: float, now: float, start: float, arrival: float, phase_seconds: Sequence[float]
) -> RoundCost:
    """The round ``[began, now]`` whose merge follows the arrival at ``arrival`` of a job that started at
    ``start`` and spent ``phase_seconds`` in :data:`JOB_PHASES`; the server computes from the arrival
    to ``now``."""
    seconds = now - began
    inside = max(0.0, arrival - max(start, began)) / max(arrival - start, 1e-300)
    path: dict[str, float] = {}
    for phase, spent in zip(JOB_PHASES, phase_seconds, strict=True):
        if spent * inside > 0:
            path[phase] = spent * inside
    if now > arrival:
        path[SERVER_COMPUTE] = now - max(arrival, began)
    path[WAIT] = max(seconds - sum(path.values()), 0.0)
    return RoundCost(seconds, 0.0, path, {})
