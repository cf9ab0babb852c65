"""The asynchronous server on the simulated clock: clients train on the model they last received and
their updates arrive at their own simulated times (docs/async.md).

The server keeps ``fraction * n`` clients in flight. A client it dispatches receives the current model
(version ``v``), trains FedAvg's local epochs (batches keyed by ``v + 1``), and uploads; its job lasts
its download, compute and upload time on its own device and links. The event loop, the refills, the
uploads, the clock and the storage are :class:`~fedge.runtime.asynchronous.AsyncEngine`'s; this module
is what FedBuff and FedAsync share as its policy: the job a client does, and the round's report.
Staleness is the number of versions between the model a client trained on and the one its update is
merged into. Under an ``adversary`` the malicious clients' updates are poisoned when the server merges
them (:mod:`fedge.runtime.buffer_adversary`); the round reports ``malicious`` and ``malicious_kept``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from fedge.algorithms.asynchronous.config import AsyncConfig
from fedge.algorithms.asynchronous.work import LocalWork, cohort_size
from fedge.algorithms.base import Context, GlobalModel
from fedge.metrics import Evaluation, RoundReport
from fedge.runtime.adversary import Adversary
from fedge.runtime.asynchronous import Arrival, AsyncEngine, Dispatch, Dispatched
from fedge.tensors import Tensors, floating

EMPTY = {"participants": 0, "staleness_mean": 0.0, "staleness_max": 0, "in_flight": 0}  # nobody at work


@dataclass(frozen=True)
class Update:
    """What a client's update carries besides its uploaded model: its integer buffers (counters, not
    sent), the model it received (one, shared by its group) and its mean training loss."""

    counters: Tensors
    base: Tensors
    loss: float


def uploaded(arrival: Arrival) -> Tensors:
    """The model an update carried, as the server decoded it (parameters and floating buffers)."""
    assert arrival.received is not None, "a FedAvg client's update is uploaded"
    return arrival.received


def delta(arrival: Arrival, model: Tensors | None = None) -> Tensors:
    """An arrived update as the server sees it: the uploaded model (or ``model``, what the server took in
    its place: an adversary's) minus the one the client received."""
    base: Tensors = arrival.payload.base
    return {k: v - base[k] for k, v in (uploaded(arrival) if model is None else model).items()}


class AsyncServer(GlobalModel):
    """FedBuff's and FedAsync's policy on the engine; subclasses say when and how to aggregate."""

    state_fields = ("params", "buffers", "engine")

    def __init__(self, ctx: Context, cfg: AsyncConfig, proximal_mu: float = 0.0):
        super().__init__(ctx, cfg)
        self.work = LocalWork(ctx, cfg, proximal_mu)
        self.model = self.work.model
        self.params, self.buffers = self.work.params, self.work.buffers
        self.concurrency = cohort_size(ctx.data.num_clients, cfg.fraction)
        self.sizes = ctx.data.client_sizes().astype(np.float64)
        self.engine = AsyncEngine(ctx, self, (Update,), self.work.up)
        self.adversary = Adversary.of(ctx.config.adversary, ctx.data, ctx.seed, ctx.cohorts.processes)
        self.figures: dict[str, object] = {}  # the adversary's, of the round's merge

    @property
    def version(self) -> int:
        """Aggregations so far."""
        return self.engine.version

    def stored(self) -> Tensors:
        return {**self.params, **self.buffers}

    def server_free(self) -> None:
        return None  # the merge happens at the closing arrival

    def serve(self, t: int, event: object) -> None:
        raise AssertionError("every message of a FedAvg client's job is its update")

    def dispatch(self, t: int, clients: np.ndarray, version: int) -> Dispatched:
        """``clients`` receive the current model in round ``t`` and train from it; each one's update."""
        params, buffers = self.work.send(t, clients, self.params, self.buffers)
        data = None if self.adversary is None else self.adversary.data(t, self.ctx.data)
        plan = self.work.plan(clients, version + 1, data)
        trained = self.work.train(plan, params, buffers, self.engine.dispatch_key, data)
        phases = self.work.phases(version + 1, clients, trained.samples)
        base = {**params, **floating(buffers)}  # the model as the clients received it (one, shared)
        each, messages = phases.each, []
        for row, client in enumerate(clients.tolist()):
            model = {k: v[row].clone() for k, v in trained.params.items()}
            model.update({k: v[row].clone() for k, v in floating(trained.buffers).items()})
            counters = {k: v[row].clone() for k, v in trained.buffers.items() if k not in model}
            update = Update(counters, base, float(trained.losses[row]))
            seconds = tuple(float(p.seconds[row]) for p in each)
            joules = tuple(float(p.joules[row]) for p in each)
            after = float(phases.seconds[row])
            messages.append(Dispatch(client, after, update, True, model, seconds, joules))
        return Dispatched(messages)

    def evaluate(self) -> Evaluation:
        """The server model's test figures, with a backdoor's attack success rate under one."""
        plain, adversary = super().evaluate(), self.adversary
        if adversary is None:
            return plain
        batch = self.ctx.config.eval.batch_size
        return plain.with_extra(
            **adversary.success(self.model, self.params, self.buffers, self.ctx.data, batch)
        )

    @abstractmethod
    def due(self, arrived: int) -> bool:
        """Whether the ``arrived`` updates received so far are to be aggregated now."""

    @abstractmethod
    def aggregate(self, t: int, arrivals: list[Arrival]) -> None:
        """Merge ``arrivals`` (sorted by dispatch) into :attr:`params` and :attr:`buffers`."""

    def staleness(self, arrival: Arrival) -> int:
        """Versions between the model the update trained on and the current one."""
        return self.version - arrival.version

    def run_round(self, t: int) -> RoundReport:
        self.figures = {}
        arrivals = self.engine.run_round(t)
        if not arrivals:
            return RoundReport(0.0, {**EMPTY, "model_version": self.version})  # an empty round
        stale = [self.version - 1 - a.version for a in arrivals]  # against the model they merged into
        weights = self.sizes[[a.client for a in arrivals]]
        losses = [a.payload.loss for a in arrivals]
        return RoundReport(
            float(np.dot(weights / weights.sum(), losses)),
            {
                "participants": len(arrivals),
                "staleness_mean": float(np.mean(stale)),
                "staleness_max": int(max(stale)),
                "model_version": self.version,
                "in_flight": self.engine.in_flight,
                **self.figures,
            },
        )

    # --- merging helpers ------------------------------------------------------------------------------

    def merge_integers(self, arrivals: list[Arrival]) -> None:
        """Integer buffers (counters) take the largest of the server's and the updates' values."""
        for name, value in self.buffers.items():
            if not value.is_floating_point():
                found = [a.payload.counters[name] for a in arrivals if name in a.payload.counters]
                self.buffers[name] = torch.stack([value, *found]).max(dim=0).values
