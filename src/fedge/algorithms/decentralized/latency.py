"""Simulated latency and energy of a peer-to-peer round on the run's wireless system.

The AFIND+ paper gives no system model; this is our completion (docs/decisions.md, "Simulated time of
a peer-to-peer round"). In a round, each client first computes (every row it trains, AFIND+'s literal
rows for requesters included, plus the probes and probe losses it evaluates), then sends its messages
one after another on its own uplink sub-channel (:meth:`fedge.system.SystemModel.peer_send`); receiving
is free. Clients run in parallel, so the slowest sets the round's latency; energy is the sum of every
client's compute and transmit energy. The bits a client sends are those its links reported for its
transfers, the same the ledger records, so the clock charges exactly the reported traffic.
"""

from __future__ import annotations

import numpy as np

from fedge.system import SystemModel, parallel_clients, training_flops


class RoundWork:
    """What each client did in one round: the samples it passed through the model (forward only, or
    forward and backward) and the bits it sent.

    Work counts at the client that does it: a trained row at its data's owner, a probe or probe loss at
    the client whose probe batch it uses, a transfer at its sender.
    """

    def __init__(self, num_clients: int):
        self.forward = np.zeros(num_clients)
        self.backward = np.zeros(num_clients)
        self.sent = np.zeros(num_clients, dtype=np.int64)

    def compute(self, clients: np.ndarray, samples: np.ndarray, backward: bool) -> None:
        """Client ``clients[r]`` passed ``samples[r]`` samples (repeated clients add up)."""
        np.add.at(self.backward if backward else self.forward, clients, samples)

    def send(self, clients: np.ndarray, bits: np.ndarray) -> None:
        """Client ``clients[r]`` sent a transfer of ``bits[r]`` bits."""
        np.add.at(self.sent, clients, bits)

    def flops(self, forward_per_sample: float) -> np.ndarray:
        """FLOPs per client: one forward pass per forward-only sample, forward + backward per other."""
        return forward_per_sample * self.forward + training_flops(forward_per_sample, self.backward)


def peer_round_cost(
    system: SystemModel, round_: int, work: RoundWork, forward_per_sample: float
) -> tuple[float, float]:
    """Seconds and joules of a round in which every client computes its ``work``, then sends its bits."""
    clients = np.arange(len(work.sent))
    return parallel_clients(
        system.client_compute(work.flops(forward_per_sample)),
        system.peer_send(clients, work.sent, round_),
    )
