"""The asynchronous server on the simulated clock: clients train on the model they last received and
their updates arrive at their own simulated times (docs/async.md).

The server keeps ``fraction * n`` clients in flight. A client it dispatches receives the current model
(version ``v``), trains FedAvg's local epochs (batches keyed by ``v + 1``), and uploads; its job lasts
its download, compute and upload time on its own device and links, and sits in the event queue until
then. A round of the runner is one aggregation: the server takes arrivals in order of simulated time
(ties in dispatch order) until the algorithm aggregates, and refills the freed places with the model it
has (arrivals at the same instant are taken together before anyone is dispatched). Clients dispatched
together start from the same version and train as one group on either executor. Staleness is the
number of versions between the model a client trained on and the one its update is merged into.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np
import torch

from fedge.algorithms.asynchronous.config import AsyncConfig
from fedge.algorithms.asynchronous.work import LocalWork, cohort_size, draw_clients, idle_online
from fedge.algorithms.base import Context, GlobalModel
from fedge.comm import nodes
from fedge.metrics import RoundReport
from fedge.system.arrivals import arrival_path
from fedge.system.clock import CLIENT_COMPUTE, DOWNLINK, SERVER, UPLINK, RoundCost
from fedge.system.events import EventQueue, Job
from fedge.tensors import floating

EMPTY = {"participants": 0, "staleness_mean": 0.0, "staleness_max": 0, "in_flight": 0}  # nobody at work


class AsyncServer(GlobalModel):
    """The event loop shared by FedBuff and FedAsync; subclasses say when and how to aggregate."""

    state_fields = ("params", "buffers", "version", "now", "draws", "refills", "queue", "flight", "arrived")

    def __init__(self, ctx: Context, cfg: AsyncConfig, proximal_mu: float = 0.0):
        super().__init__(ctx, cfg)
        self.work = LocalWork(ctx, cfg, proximal_mu)
        self.model = self.work.model
        self.params, self.buffers = self.work.params, self.work.buffers
        self.concurrency = cohort_size(ctx.data.num_clients, cfg.fraction)
        self.sizes = ctx.data.client_sizes().astype(np.float64)
        self.version = 0  # aggregations so far
        self.now = 0.0  # the server's simulated time
        self.draws = 0  # availability draws so far (one per dispatch)
        self.refills = 0  # dispatches at the current version
        self.queue = EventQueue()
        self.flight: dict[int, dict[str, Any]] = {}  # by job seq: the client's trained model and its costs
        self.arrived: list[dict[str, Any]] = []  # updates received, not yet aggregated
        ctx.network.hold(nodes.SERVER, "model", {**self.params, **self.buffers})

    # --- dispatch -------------------------------------------------------------------------------------

    def _eligible(self) -> np.ndarray:
        """Clients online at the next availability draw, not in flight and not waiting in the buffer."""
        self.draws += 1
        busy = self.queue.clients() | {update["client"] for update in self.arrived}
        return idle_online(self.ctx.system, self.draws, busy)

    def refill(self, t: int) -> None:
        """Dispatch the current model to as many clients as there are free places (round ``t``)."""
        free = self.concurrency - len(self.queue)
        if free <= 0:
            return
        pool = self._eligible()
        keys = (self.version + 1,) if self.refills == 0 else (self.version + 1, self.refills)
        clients = draw_clients(self.ctx.seed, pool, free, *keys)
        if not len(clients):
            return
        self.refills += 1
        params, buffers = self.work.send(t, clients, self.params, self.buffers)
        plan = self.work.plan(clients, self.version + 1)
        trained = self.work.train(plan, params, buffers)
        phases = self.work.phases(self.version + 1, clients, trained.samples)
        ends = self.now + phases.seconds
        base = {**params, **floating(buffers)}  # the model as the clients received it (one, shared)
        for row, client in enumerate(clients):
            job = self.queue.push(ends[row], client, self.version, self.now)
            model = {k: v[row].clone() for k, v in trained.params.items()}
            model.update({k: v[row].clone() for k, v in floating(trained.buffers).items()})
            counters = {k: v[row].clone() for k, v in trained.buffers.items() if k not in model}
            self.flight[job.seq] = {
                "model": model,
                "counters": counters,
                "base": base,
                "loss": float(trained.losses[row]),
                "seconds": [float(p.seconds[row]) for p in (phases.down, phases.compute, phases.up)],
                "joules": [float(p.joules[row]) for p in (phases.down, phases.compute, phases.up)],
            }

    # --- arrivals -------------------------------------------------------------------------------------

    def receive(self, t: int, job: Job) -> None:
        """The job's update reaches the server in round ``t``: its upload goes on the ledger, its energy
        on the clock, and the update into :attr:`arrived`."""
        done = self.flight.pop(job.seq)
        up = self.work.up.send(t, nodes.client(job.client), nodes.SERVER, "model_up", done["model"])
        down_j, compute_j, up_j = done["joules"]
        spent = {
            SERVER: {DOWNLINK: down_j},
            nodes.client(job.client): {CLIENT_COMPUTE: compute_j, UPLINK: up_j},
        }
        self.ctx.system.charge(RoundCost(0.0, down_j + compute_j + up_j, {}, spent))
        self.arrived.append(
            {
                "seq": job.seq,
                "client": job.client,
                "version": job.version,
                "model": up.payload,
                "counters": done["counters"],
                "delta": {k: v - done["base"][k] for k, v in up.payload.items()},  # as the server sees it
                "loss": done["loss"],
                "seconds": done["seconds"],
                "start": job.start,
            }
        )

    @abstractmethod
    def due(self) -> bool:
        """Whether the updates received so far are to be aggregated now."""

    @abstractmethod
    def aggregate(self, updates: list[dict[str, Any]]) -> None:
        """Merge ``updates`` (sorted by dispatch) into :attr:`params` and :attr:`buffers`."""

    def staleness(self, update: dict[str, Any]) -> int:
        """Versions between the model the update trained on and the current one."""
        return self.version - int(update["version"])

    def run_round(self, t: int) -> RoundReport:
        began = self.now
        self.refill(t)
        while not self.due():
            if not len(self.queue):  # nobody in flight and nobody could be dispatched: merge what came
                if self.arrived:
                    break
                return RoundReport(0.0, {**EMPTY, "model_version": self.version})  # an empty round
            job = self.queue.pop()
            self.now = job.time
            self.receive(t, job)
            if not self.due() and not (len(self.queue) and self.queue.peek().time == self.now):
                self.refill(t)  # the freed places, once every arrival of this instant is in
        closing = self.arrived[-1]
        updates = sorted(self.arrived, key=lambda u: u["seq"])
        stale = [self.staleness(u) for u in updates]
        weights = self.sizes[[u["client"] for u in updates]]
        train_loss = float(np.dot(weights / weights.sum(), [u["loss"] for u in updates]))
        self.aggregate(updates)
        self.arrived = []
        self.version += 1
        self.refills = 0
        self.ctx.system.charge(arrival_path(began, self.now, closing["start"], closing["seconds"]))
        self.ctx.network.hold(
            nodes.clients([u["client"] for u in updates]), "model", {**self.params, **self.buffers}
        )
        return RoundReport(
            train_loss,
            {
                "participants": len(updates),
                "staleness_mean": float(np.mean(stale)),
                "staleness_max": int(max(stale)),
                "model_version": self.version,
                "in_flight": len(self.queue),
            },
        )

    # --- merging helpers ------------------------------------------------------------------------------

    def merge_integers(self, updates: list[dict[str, Any]]) -> None:
        """Integer buffers (counters) take the largest of the server's and the updates' values."""
        for name, value in self.buffers.items():
            if not value.is_floating_point():
                found = [u["counters"][name] for u in updates if name in u["counters"]]
                self.buffers[name] = torch.stack([value, *found]).max(dim=0).values
