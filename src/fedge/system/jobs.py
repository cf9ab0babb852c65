"""A FedAvg client's job on its own device and links: it receives the model, trains, and uploads its
model, one after another (the straggler-aware and asynchronous servers' unit of work)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.system.compute import training_flops
from fedge.system.model import PhaseCost, SystemModel


@dataclass(frozen=True)
class JobPhases:
    """The three phases of a group of clients' jobs, one row per client."""

    down: PhaseCost
    compute: PhaseCost
    up: PhaseCost

    @property
    def seconds(self) -> np.ndarray:
        """Each job's duration: download, compute and upload one after another."""
        return self.down.seconds + self.compute.seconds + self.up.seconds

    @property
    def each(self) -> tuple[PhaseCost, PhaseCost, PhaseCost]:
        """Download, compute and upload, in order."""
        return self.down, self.compute, self.up


def job_phases(
    system: SystemModel,
    round_: int,
    clients: np.ndarray,
    flops: np.ndarray,
    down_bits: float,
    up_bits: float,
) -> JobPhases:
    """What each of ``clients``' jobs costs: receiving ``down_bits``, computing ``flops``, uploading
    ``up_bits``, on its own device and links (fading of round ``round_``)."""
    count = len(clients)
    return JobPhases(
        system.download(clients, np.full(count, down_bits), round_),
        system.client_compute(flops, clients),
        system.upload(clients, np.full(count, up_bits), round_),
    )


def steps_within(
    system: SystemModel,
    clients: np.ndarray,
    step_samples: np.ndarray,
    flops_per_sample: float,
    seconds: np.ndarray,
) -> np.ndarray:
    """How many of its local steps (``step_samples[r]``: the samples of each) client ``clients[r]``
    completes in ``seconds[r]`` of compute."""
    cost = system.client_compute(
        training_flops(flops_per_sample, np.cumsum(step_samples, axis=1)).T, clients
    ).seconds.T  # seconds to finish each step, per row
    done = (cost <= np.asarray(seconds)[:, None]) & (step_samples > 0)
    return np.asarray(done.sum(axis=1), dtype=np.int64)
