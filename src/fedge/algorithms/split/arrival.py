"""A shared split server that serves uploads in the order they arrive (``server_order: arrival``).

Our completion (no paper of the family times its queue; CSE-FSL Sec. II-E only says the server takes
smashed data first come, first served): each round runs a simulated timeline from the round's start. A
participant is ready once its models are downloaded; before each upload it computes the local steps since
its previous upload (training FLOPs of trunk and aux head, as the round's compute elsewhere) and sends
the smashed data and labels on its uplink, so its upload arrives at ``ready + compute + upload`` plus an
optional seeded jitter (uniform on ``[0, arrival_jitter_s]``, for whatever delays the system model does
not have). The one server model serves a step's uploads in arrival order (ties by row), each for its
server compute time, starting when both the upload and the server are there; the difference is the
upload's queue wait. A client that needs the cut-layer gradient (SplitFed) is ready again when it has
downloaded it; an aux-head client (CSE-FSL) goes on right after its upload. The round lasts until the
last participant has done what is left after its last upload (its remaining steps, the model upload and
any downloads not yet placed, such as a mid-round broadcast) or until the server is done, whichever is
later. Energy is unchanged: waiting costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.system.split import serve_queue


@dataclass
class Timeline:
    """One round's simulated times per participant row, in seconds since the round began.

    ``ready``: when the row can start its next local step; ``computed``/``up_bits``/``down_bits``: the
    samples and bits already placed on the timeline; ``wait``: the row's total queue wait; ``server_free``:
    when the server finished its last job; ``exchanges``: uploads rounds so far (keys the jitter).
    """

    ready: np.ndarray
    computed: np.ndarray
    up_bits: np.ndarray
    down_bits: np.ndarray
    wait: np.ndarray
    server_free: float = 0.0
    exchanges: int = 0

    @classmethod
    def start(cls, download_seconds: np.ndarray, download_bits: np.ndarray) -> Timeline:
        """Every row ready once its broadcast (``download_bits``, taking ``download_seconds``) is in."""
        count = len(download_seconds)
        zeros = [np.zeros(count) for _ in range(3)]
        return cls(np.asarray(download_seconds, dtype=np.float64).copy(), zeros[0], zeros[1],
                   np.asarray(download_bits, dtype=np.float64).copy(), zeros[2])  # fmt: skip

    def only(self, rows: list[int]) -> Timeline:
        """The timeline of the rows ``rows`` alone (a round that lost the others)."""
        return Timeline(
            self.ready[rows], self.computed[rows], self.up_bits[rows], self.down_bits[rows], self.wait[rows],
            self.server_free, self.exchanges,
        )  # fmt: skip

    def arrive(
        self, rows: np.ndarray, compute_s: np.ndarray, upload_s: np.ndarray, jitter_s: np.ndarray
    ) -> np.ndarray:
        """Arrival times of the uploads of ``rows``; the rows are busy until their upload is sent."""
        sent = self.ready[rows] + compute_s + upload_s
        self.ready[rows] = sent
        self.exchanges += 1
        return sent + jitter_s

    def serve(
        self, rows: np.ndarray, arrival: np.ndarray, service_s: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Queue the uploads of ``rows``: their order (indices into ``rows``) and finish times (the rows'
        queue waits add up)."""
        order, start, finish, self.server_free = serve_queue(arrival, service_s, self.server_free)
        np.add.at(self.wait, rows, start - arrival)
        return order, finish
