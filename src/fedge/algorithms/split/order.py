"""Server order: how one shared server model queues a step's uploads, one policy per ``server_order``.

- :class:`RoundRobin` (``round_robin``): a step's uploads in row order (CSE-FSL Sec. II-E's deterministic
  simulation of the FIFO queue);
- :class:`RandomOrder` (``random``): a fresh seeded permutation per step (CSE-FSL Fig. 6);
- :class:`ArrivalOrder` (``arrival``): in the order the uploads reach the server on the simulated clock
  (:mod:`~fedge.algorithms.split.arrival`); the round's queue waits enter its time;
- :class:`ClientAfterClient` (``client_after_client``, SplitFed's own order): each participant's whole
  local run in turn, so the round's rows pass one by one.

A policy is chosen once from the config (:func:`server_order`). It also says which rows this process
runs: a round is spread over the processes unless its rows must pass one after another (client after
client) or there are fewer rows than processes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from fedge.algorithms.split.arrival import Timeline
from fedge.algorithms.split.cost import SplitFlops
from fedge.algorithms.split.round import Round
from fedge.distributed import Cohort, Cohorts
from fedge.rng import numpy_rng
from fedge.system import SystemModel, training_flops


class Queued(NamedTuple):
    """A step's serving order (indices into the exchange's rows) and, on a simulated queue, each served
    upload's finish time (seconds since the round began)."""

    order: list[int]
    finish: np.ndarray | None = None


class ServerOrder:
    """A server-order policy; by default a step's uploads are served in row order, and a round's rows
    run together."""

    def cohort(self, cohorts: Cohorts, count: int) -> Cohort:
        """The rows of a round of ``count`` rows this process runs (docs/scale-out.md): a block of them
        when the round is spread over the processes, else all of them (every process repeats the round,
        with fewer rows than processes)."""
        if cohorts.spread and count >= cohorts.processes:
            return cohorts.of(count)
        return cohorts.whole(count)

    def passes(self, count: int, device: torch.device) -> list[torch.Tensor | None]:
        """The round's local runs, as subsets of its rows (None: all rows at once)."""
        return [None]

    def begin(self, rnd: Round) -> None:
        """Start the round's queue once the broadcast is in (nothing to start here)."""

    def queue(self, rnd: Round, step: int, at: np.ndarray, bits: np.ndarray, counts: torch.Tensor) -> Queued:
        """The serving order of step ``step``'s uploads from rows ``at`` of the round (``bits`` and
        ``counts`` per exchange row; rows with 0 samples send nothing)."""
        return Queued(torch.nonzero(counts > 0).flatten().tolist())

    def returned(self, rnd: Round, at: np.ndarray, queued: Queued, bits: np.ndarray) -> None:
        """The served rows received their cut-layer gradients (``bits`` per exchange row)."""

    def figures(self, rnd: Round) -> dict[str, float]:
        """What the round's report says about the queue."""
        return {}


class RoundRobin(ServerOrder):
    """A step's uploads in row order (the default policy)."""


class RandomOrder(ServerOrder):
    """A fresh permutation of each step's uploads, from the stream ``(seed, "server-order", t, step)``."""

    def __init__(self, seed: int):
        self.seed = seed

    def queue(self, rnd: Round, step: int, at: np.ndarray, bits: np.ndarray, counts: torch.Tensor) -> Queued:
        senders = super().queue(rnd, step, at, bits, counts).order
        if len(senders) < 2:
            return Queued(senders)
        perm = numpy_rng(self.seed, "server-order", rnd.t, step).permutation(len(senders))
        return Queued([senders[i] for i in perm])


class ClientAfterClient(ServerOrder):
    """Each participant's whole local run in turn: the rows pass one by one, on every process (each would
    wait for the clients of the processes before it)."""

    def cohort(self, cohorts: Cohorts, count: int) -> Cohort:
        return cohorts.whole(count)

    def passes(self, count: int, device: torch.device) -> list[torch.Tensor | None]:
        return list(torch.arange(count, device=device).split(1))


class ArrivalOrder(ServerOrder):
    """Uploads served in the order they arrive on the round's simulated timeline (:class:`Timeline`):
    each participant computes its steps since its last upload and sends on its uplink, plus a seeded
    jitter of up to ``jitter_s`` seconds; a SplitFed participant goes on once its gradient is back."""

    def __init__(self, system: SystemModel, seed: int, jitter_s: float, flops: SplitFlops):
        self.system, self.seed, self.jitter_s, self.flops = system, seed, jitter_s, flops

    def begin(self, rnd: Round) -> None:
        down = self.system.download(rnd.draws.clients, rnd.tally.down_bits, rnd.t)
        rnd.timeline = Timeline.start(down.seconds, rnd.tally.down_bits)

    @staticmethod
    def timeline(rnd: Round) -> Timeline:
        """The round's timeline, which :meth:`begin` started."""
        if rnd.timeline is None:
            raise RuntimeError("the arrival order's round has no timeline: begin() starts it")
        return rnd.timeline

    def place(
        self, rnd: Round, at: np.ndarray, bits: np.ndarray, counts: torch.Tensor
    ) -> tuple[list[int], np.ndarray]:
        """Place a step's uploads from rows ``at`` of the round on its timeline: the sending rows
        (indices into ``at``) and their arrival times (seconds since the round began)."""
        sending = torch.nonzero(counts > 0).flatten().tolist()
        timeline, system, t, rows = self.timeline(rnd), self.system, rnd.t, at[sending]
        samples = counts.cpu().numpy()[sending].astype(np.float64)
        pending = rnd.tally.client_samples[rows] + samples - timeline.computed[rows]
        timeline.computed[rows] += pending
        timeline.up_bits[rows] += bits[sending]
        clients = rnd.draws.clients[rows]
        compute = system.client_compute(training_flops(self.flops.trunk + self.flops.aux, pending), clients)
        upload = system.upload(clients, bits[sending], t).seconds
        jitter = numpy_rng(self.seed, "arrival-jitter", t, timeline.exchanges).uniform(
            0.0, self.jitter_s, len(rows)
        )
        return sending, timeline.arrive(rows, compute.seconds, upload, jitter)

    def service(self, samples: np.ndarray) -> np.ndarray:
        """The server's compute seconds for uploads of ``samples`` samples each."""
        return self.system.server_compute(training_flops(self.flops.server, samples)).seconds

    def queue(self, rnd: Round, step: int, at: np.ndarray, bits: np.ndarray, counts: torch.Tensor) -> Queued:
        """Place the step's uploads on the timeline and queue them by arrival."""
        sending, arrival = self.place(rnd, at, bits, counts)
        samples = counts.cpu().numpy()[sending].astype(np.float64)
        queued, finish = self.timeline(rnd).serve(at[sending], arrival, self.service(samples))
        return Queued([sending[i] for i in queued], finish)

    def returned(self, rnd: Round, at: np.ndarray, queued: Queued, bits: np.ndarray) -> None:
        """The served rows are ready again once their gradients are downloaded."""
        sending = sorted(queued.order)
        rows, back = at[sending], bits[sending]
        received = self.system.download(rnd.draws.clients[rows], back, rnd.t).seconds
        timeline = self.timeline(rnd)
        timeline.ready[rows] = queued.finish + received
        timeline.down_bits[rows] += back

    def figures(self, rnd: Round) -> dict[str, float]:
        return {"queue_wait_s": float(self.timeline(rnd).wait.sum())}


def server_order(
    name: str, system: SystemModel, seed: int, jitter_s: float, flops: SplitFlops
) -> ServerOrder:
    """The policy of ``server_order`` ``name``."""
    if name == "random":
        return RandomOrder(seed)
    if name == "arrival":
        return ArrivalOrder(system, seed, jitter_s, flops)
    if name == "client_after_client":
        return ClientAfterClient()
    return RoundRobin()
