"""What a split round costs on the simulated clock: the FLOPs per sample of each part of the model,
counted once per run (backward = 2 x forward), and each round's per-row bits and samples, from the round's
tally, handed to the system model (per row, not per node: a client drawn twice is two participants)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.algorithms.split.parts import SplitParts
from fedge.algorithms.split.round import Round
from fedge.system import (
    RoundCost,
    SplitWork,
    SystemModel,
    arrival_round,
    forward_flops,
    split_round,
    training_flops,
)
from fedge.system.compute import BACKWARD_FACTOR


@dataclass(frozen=True)
class SplitFlops:
    """Forward FLOPs per sample of the client trunk, the aux head (0 without one) and the server part."""

    trunk: float
    aux: float
    server: float


def count_flops(parts: SplitParts) -> SplitFlops:
    """FLOPs per sample of each part of ``parts``."""
    aux = forward_flops(parts.aux, parts.smashed_shape) if parts.has_aux else 0
    return SplitFlops(
        trunk=forward_flops(parts.trunk, parts.input_shape),
        aux=aux,
        server=forward_flops(parts.server, parts.smashed_shape),
    )


def alignment_flops(flops: SplitFlops, samples: int, epochs: int) -> float:
    """FLOPs of one FSL-SAGE alignment on ``samples`` stored samples: the server's forward pass and
    backward pass to its input on each (its true cut-layer gradients: a training pass), then ``epochs``
    passes of the gradient-matching loss, each a forward and backward pass of the aux model (its estimate)
    differentiated once more in the aux weights: by the clock's rule that backward costs twice the pass
    it differentiates, so (1 + 2) training passes of the aux model per sample and epoch."""
    true = training_flops(flops.server, samples)
    fit = (1.0 + BACKWARD_FACTOR) * training_flops(flops.aux, samples * epochs)
    return float(true + fit)


def round_cost(system: SystemModel, rnd: Round, flops: SplitFlops, shared: bool) -> RoundCost:
    """Round ``rnd``'s latency and energy: server copies on each participant's path, or one ``shared``
    server model; with ``server_order: arrival`` the queue's timeline places the uploads it saw."""
    tally, clients, timeline = rnd.tally, rnd.draws.clients, rnd.timeline
    client = client_flops(flops, tally.client_samples)
    work = SplitWork(
        clients, tally.up_bits, tally.down_bits, client, training_flops(flops.server, tally.server_samples)
    )
    if timeline is None:
        return split_round(system, rnd.t, work, shared)
    unplaced = SplitWork(
        clients, tally.up_bits - timeline.up_bits, tally.down_bits - timeline.down_bits,
        client_flops(flops, tally.client_samples - timeline.computed), np.zeros(len(clients)),
    )  # fmt: skip
    return arrival_round(system, rnd.t, work, unplaced, timeline.ready, timeline.server_free)


def client_flops(flops: SplitFlops, samples: np.ndarray) -> np.ndarray:
    """Training FLOPs of the client side (trunk and aux head) over ``samples`` samples per row."""
    return training_flops(flops.trunk + flops.aux, samples)
