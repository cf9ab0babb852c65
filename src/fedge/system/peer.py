"""What each client of a peer-to-peer round computed, for :func:`fedge.system.rounds.peer_round`.

Work counts at the client that does it: a trained row at its data's owner, a probe or probe loss at the
client whose probe batch it uses (AFIND+'s literal rows for requesters included). What a client sends is
read from the round's traffic, not tallied here.
"""

from __future__ import annotations

import numpy as np

from fedge.system.compute import training_flops


class RoundWork:
    """The samples each client passed through the model in one round: forward only, or forward and
    backward."""

    def __init__(self, num_clients: int):
        self.forward = np.zeros(num_clients)
        self.backward = np.zeros(num_clients)

    def compute(self, clients: np.ndarray, samples: np.ndarray, backward: bool) -> None:
        """Client ``clients[r]`` passed ``samples[r]`` samples (repeated clients add up)."""
        np.add.at(self.backward if backward else self.forward, clients, samples)

    def flops(self, forward_per_sample: float) -> np.ndarray:
        """FLOPs per client: one forward pass per forward-only sample, forward + backward per other."""
        return forward_per_sample * self.forward + training_flops(forward_per_sample, self.backward)
