"""Simulated latency and energy of a split-learning round on the wireless system model.

Neither split paper measures time (CSE-FSL claims asynchrony benefits, Fig. 3, but reports no times), so this
composition is our completion, labelled as such: every participant downloads its models, computes its local
steps, sends its smashed data, labels and models, and receives any returned gradients, one after another on
its own sub-channel; participants work in parallel. Server copies (FSL_MC, FSL_AN) run in parallel, each on
its client's path. One shared server model (FSL_OC, CSE-FSL) processes every upload in turn, so the round
lasts at least its total compute: latency = max(slowest client path, shared server compute). Energy is the sum
of everything. FLOPs per sample are counted once per part (backward = 2 x forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.algorithms.split.parts import SplitParts
from fedge.system import SystemModel, forward_flops, parallel_clients, training_flops


@dataclass(frozen=True)
class SplitFlops:
    """Forward FLOPs per sample of the client trunk, the aux head (0 without one) and the server part."""

    trunk: float
    aux: float
    server: float


def count_flops(parts: SplitParts) -> SplitFlops:
    """FLOPs per sample of each part of ``parts``."""
    aux = forward_flops(parts.local.aux, parts.smashed_shape) if parts.has_aux else 0
    return SplitFlops(
        trunk=forward_flops(parts.trunk, parts.input_shape),
        aux=aux,
        server=forward_flops(parts.server, parts.smashed_shape),
    )


def round_cost(
    system: SystemModel,
    round_: int,
    clients: np.ndarray,
    up_bits: np.ndarray,
    down_bits: np.ndarray,
    client_samples: np.ndarray,
    server_samples: np.ndarray,
    flops: SplitFlops,
    shared_server: bool,
) -> tuple[float, float]:
    """Seconds and joules of one round; per-row arrays hold each participant's bits and samples."""
    down = system.download(clients, down_bits, round_)
    compute = system.client_compute(training_flops(flops.trunk + flops.aux, client_samples))
    up = system.upload(clients, up_bits, round_)
    server = system.server_compute(training_flops(flops.server, server_samples))
    if not shared_server:
        return parallel_clients(down, compute, up, server)
    seconds, joules = parallel_clients(down, compute, up)
    return max(seconds, float(server.seconds.sum())), joules + float(server.joules.sum())
