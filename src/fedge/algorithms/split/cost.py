"""What a split round cost on the simulated clock: its per-row bits and samples, from the round's tally,
handed to the system model (per row, not per node: a client drawn twice is two participants)."""

from __future__ import annotations

import numpy as np

from fedge.algorithms.split.flops import SplitFlops
from fedge.algorithms.split.round import Round
from fedge.system import RoundCost, SplitWork, SystemModel, arrival_round, split_round, training_flops


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
