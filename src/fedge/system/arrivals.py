"""The clock of an asynchronous server (:class:`~fedge.runtime.asynchronous.AsyncEngine` calls these):
a job's energy as it arrives, and the critical path of a round, the job whose arrival closed it.

An asynchronous round (one aggregation) lasts from the server's time when it began to its time at the
merge. Its seconds are split by phase along the job of the update that closed it, so that the clock's
breakdown adds up to the round like a synchronous round's does. Two servers, two rules:

- :func:`arrival_path` (FedBuff, FedAsync: the merge happens at the closing arrival): the closing job's
  download, compute and upload, each counted for the part of it inside the round, and as ``wait`` the
  time before the job started;
- :func:`merge_path` (asynchronous CSE-FSL: the merge also waits for the shared server's backlog): the
  closing job's phases in proportion to the share of the job inside the round, the server's compute
  after the arrival, and the rest as ``wait``.

:func:`round_path` picks the rule by whether the merge waits for a server backlog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedge.system.clock import (
    CLIENT_COMPUTE,
    DOWNLINK,
    SERVER,
    SERVER_COMPUTE,
    UPLINK,
    WAIT,
    RoundCost,
    client_nodes,
)
from fedge.system.model import SystemModel
from fedge.system.split import SplitWork, split_round

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


def round_path(
    began: float, now: float, start: float, arrival: float, phase_seconds: Sequence[float], backlog: bool
) -> RoundCost:
    """The round ``[began, now]`` closed by the job that started at ``start`` and arrived at
    ``arrival``: :func:`merge_path` when the merge waited for a server's ``backlog``, else
    :func:`arrival_path`."""
    if backlog:
        return merge_path(began, now, start, arrival, phase_seconds)
    return arrival_path(began, now, start, phase_seconds)


def job_energy(client: int, phase_joules: Sequence[float]) -> RoundCost:
    """The energy of one client's job in :data:`JOB_PHASES` (no time: the round's path has it): the
    server sends the model, the client computes and uploads."""
    down, compute, up = phase_joules
    spent = {SERVER: {DOWNLINK: down}, client_nodes([client])[0]: {CLIENT_COMPUTE: compute, UPLINK: up}}
    return RoundCost(0.0, down + compute + up, {}, spent)


@dataclass(frozen=True)
class SplitJobs:
    """A dispatched group of asynchronous split clients: when each one's client model reaches the
    server (seconds since the dispatch), each job's seconds in :data:`JOB_PHASES` and the group's
    energy (no time: the rounds' paths have it)."""

    arrival: np.ndarray
    seconds: tuple[np.ndarray, np.ndarray, np.ndarray]
    energy: RoundCost


def split_jobs(
    system: SystemModel,
    round_: int,
    work: SplitWork,
    cut_ready: np.ndarray,
    rest_flops: np.ndarray,
    model_bits: np.ndarray,
) -> SplitJobs:
    """The jobs of ``work``'s clients (round ``round_``'s fading) that are done with their cut traffic at
    ``cut_ready``, then compute ``rest_flops`` more and upload their client model (``model_bits``); the
    energy is the shared-server split round's (:func:`~fedge.system.split.split_round`)."""
    clients = work.clients
    arrival = (
        cut_ready
        + system.client_compute(rest_flops, clients).seconds
        + system.upload(clients, model_bits, round_).seconds
    )
    job = split_round(system, round_, work, shared=True)
    seconds = (
        system.download(clients, work.down_bits, round_).seconds,
        system.client_compute(work.client_flops, clients).seconds,
        system.upload(clients, work.up_bits, round_).seconds,
    )
    return SplitJobs(arrival, seconds, RoundCost(0.0, job.joules, {}, job.joules_by_node))
