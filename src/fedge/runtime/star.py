"""The star round: a server, the clients drawn for a round, and the work every server-client round does.

FedAvg's round (and every algorithm with one global model on a server) is its paper's lines -- train
locally from the broadcast model, send the trained model back, average -- around the same pipes: draw
the participants (only the online ones under device profiles), send the model down, train this
process's rows of the participants (keeping each one's optimizer state where the run keeps it), send the
trained models up, aggregate through the server's pipeline, hold the new model on every participant and
close the round on the clock by the star rule (:func:`fedge.system.star_round`), which reads the round's
traffic on the ledger: a stage's own messages (secure aggregation's) are then timed with the round's.
:class:`StarRuntime` holds the initial model in storage and opens a round; :class:`StarRound` does those
steps, so that no algorithm writes a link send, a storage hold, cohort row arithmetic or a latency
formula itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np
import torch
from torch import nn

from fedge.aggregation import Updates, sites
from fedge.aggregation.fltrust import FLTrust
from fedge.comm import Link, nodes
from fedge.data.federated import BatchPlan, FederatedData
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.engine.step import StepFn
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.privacy.client_level import star_participation
from fedge.rng import numpy_rng
from fedge.runtime.adversary import Adversary
from fedge.runtime.availability import choose, online_clients
from fedge.runtime.context import Context
from fedge.runtime.root import LocalWork, root_update
from fedge.runtime.storage import hold_frozen_base
from fedge.system import forward_flops, star_round, training_flops
from fedge.tensors import Tensors, floating


def sample_clients(
    seed: int, round_: int, num_clients: int, fraction: float, online: np.ndarray | None = None
) -> np.ndarray:
    """A sorted random subset of ``max(1, round(fraction * n))`` clients, fixed by ``(seed, round)``;
    only the ``online`` ones when given, as many as there are."""
    count = max(1, round(fraction * num_clients))
    pool = num_clients if online is None else len(online)
    if count >= pool:
        return np.arange(num_clients) if online is None else online.copy()
    return np.sort(choose(numpy_rng(seed, "participants", round_), num_clients, count, False, online))


def poisson_clients(
    seed: int, round_: int, num_clients: int, fraction: float, online: np.ndarray | None = None
) -> np.ndarray:
    """Each client independently with probability ``fraction`` (Poisson participation), fixed by
    ``(seed, "participants", round)``; only the ``online`` ones when given. May be empty."""
    drawn = numpy_rng(seed, "participants", round_).random(num_clients) < fraction
    if online is not None:
        mask = np.zeros(num_clients, dtype=bool)
        mask[online] = True
        drawn &= mask
    return np.flatnonzero(drawn)


class OptimizerStates(Protocol):
    """Where the participants' optimizer states go when their training ends (the algorithm's
    :class:`~fedge.algorithms.optimizer_state.ClientOptimizerStates`: kept per client, or dropped)."""

    def end(self, clients: np.ndarray, own: Tensors, cohort: Cohort) -> None: ...


@dataclass
class StarRound:
    """Round ``round`` of the server and its participants ``clients`` (sorted; the whole cohort), of
    which this process runs the rows of ``cohort``; the model's forward pass costs ``flops_per_sample``."""

    ctx: Context
    round: int
    clients: np.ndarray
    cohort: Cohort
    flops_per_sample: float
    adversary: Adversary | None = None
    figures: dict[str, object] = field(default_factory=dict)  # the adversary's, once aggregated
    local: tuple[int, int, bool] | None = None  # the plan's epochs, batch size and drop_last
    work: LocalWork | None = None  # how the participants trained (what FLTrust's root training repeats)
    batches: BatchPlan | None = None  # the participants' local steps (what output.record keeps of them)

    @property
    def receivers(self) -> list[str]:
        """The participants' node names."""
        return nodes.clients(self.clients)

    @property
    def local_clients(self) -> np.ndarray:
        """The participants this process trains."""
        return np.asarray(self.cohort.take(self.clients))

    @cached_property
    def shares(self) -> torch.Tensor:
        """Every participant's sample weight ``n_k / sum n_k`` (float64)."""
        sizes = torch.as_tensor(self.ctx.data.client_sizes(self.clients), dtype=torch.float64)
        return (sizes / sizes.sum()).to(self.ctx.device)

    @cached_property
    def weights(self) -> torch.Tensor:
        """This process's rows of the participants' sample weights :attr:`shares`."""
        return self.shares[self.cohort.rows]

    def broadcast(self, link: Link, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        """The server sends the model (parameters and floating buffers) to every participant
        (``model_down``); the participants' decoded copy comes back (integer counters stay as they are)."""
        model = {**params, **floating(buffers)}
        down = link.send(self.round, nodes.SERVER, self.receivers, "model_down", model)
        return {k: down.payload[k] for k in params}, {k: down.payload.get(k, v) for k, v in buffers.items()}

    @property
    def data(self) -> FederatedData:
        """The data the participants train on: the run's, or an attacking adversary's poisoned view."""
        return self.ctx.data if self.adversary is None else self.adversary.data(self.round, self.ctx.data)

    def plan(self, epochs: int, batch_size: int, drop_last: bool) -> BatchPlan:
        """This process's participants' local steps: ``epochs`` passes in batches of ``batch_size`` (over
        :attr:`data`: a backdoor's malicious clients index their stamped copies)."""
        self.local = (epochs, batch_size, drop_last)
        self.batches = self.data.batch_plan(self.local_clients, self.round, epochs, batch_size, drop_last)
        return self.batches

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, lr: float, states: OptimizerStates
    ) -> torch.Tensor:
        """The executor trains ``bank`` by ``plan``; each row's mean training loss. The rows' optimizer
        states then go to ``states`` (kept for each client's next round, where the run keeps them)."""
        if self.local is not None:
            self.work = LocalWork(step, lr, *self.local)
        losses = self.ctx.executor.train(step, bank, plan, self.data, lr)
        states.end(self.clients, bank.opt_state, self.cohort)
        return losses

    def collect(self, link: Link, bank: ClientBank) -> Tensors:
        """Every participant sends its trained model up (``model_up``; on the ledger unless the server's
        reducer records the upload itself, :meth:`~fedge.runtime.context.Context.records_upload`); the
        server's decoded rows (this process's), parameters then buffers (integer counters as trained:
        they are not sent)."""
        trained = {**bank.params, **floating(bank.buffers)}
        record = self.ctx.records_upload(sites.SERVER)
        up = self.cohort.send(
            link, self.round, self.receivers, nodes.SERVER, "model_up", trained, record=record
        )
        stacked = {k: up.payload[k] for k in bank.params}
        stacked.update({k: up.payload.get(k, v) for k, v in bank.buffers.items()})
        return stacked

    def close(self, plan: BatchPlan) -> None:
        """Advance the clock by the round, composed by the star rule: each participant downloads, trains
        on the samples of its ``plan`` and uploads the round's traffic, participants in parallel."""
        samples = self.cohort.gather_array(plan.weight.sum(dim=(1, 2)).cpu().numpy())
        flops = training_flops(self.flops_per_sample, samples)
        system, traffic = self.ctx.system, self.ctx.network.traffic(self.round)
        system.charge(star_round(system, self.round, self.clients, flops, traffic))

    def aggregate(self, stacked: Tensors, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        """The server's new model (parameters, buffers) from the participants' rows, through the server's
        pipeline (by default the sample-weighted mean); ``params`` and ``buffers`` are the model they
        started from. Every participant then holds the new model (a FedAvg client keeps the last model it
        received). An adversary's participants first replace their rows (:mod:`fedge.runtime.adversary`);
        an ``fltrust`` reducer is first given the server's root update (:mod:`fedge.runtime.root`)."""
        senders = tuple(int(c) for c in self.local_clients)
        reference, pipeline = {**params, **buffers}, self.ctx.pipeline(sites.SERVER)
        if isinstance(pipeline.reducer, FLTrust) and self.work is not None:
            model = (params, buffers)
            pipeline.reducer.root = root_update(
                self.ctx, self.round, self.work, pipeline.reducer, model, self.flops_per_sample
            )
        if self.adversary is not None:
            stacked = self.adversary.poison(self.round, self.clients, stacked, reference, self.cohort)
        self.record(stacked, reference)
        updates = Updates.of(sites.SERVER, self.round, stacked, self.weights, reference, senders)
        averaged = pipeline.reduce(updates, self.cohort)
        if self.adversary is not None:
            self.figures = self.adversary.figures(self.round, self.clients, self.shares, pipeline)
        new_params, new_buffers = {k: averaged[k] for k in params}, {k: averaged[k] for k in buffers}
        self.ctx.network.hold(self.receivers, "model", {**new_params, **new_buffers})
        return new_params, new_buffers

    def record(self, stacked: Tensors, reference: Tensors) -> None:
        """Hand the uploads the server received to the run's recorder (``output.record: [updates]``), with
        the samples each participant trained on and its local work."""
        recorder = self.ctx.recorder
        if not recorder.recording_updates or self.batches is None or self.work is None:
            return
        plan, work = self.batches, self.work
        samples = [
            np.unique(plan.index[r][plan.weight[r] > 0].cpu().numpy()) for r in range(len(plan.clients))
        ]
        local: dict[str, float | np.ndarray] = {
            "lr": work.lr, "local_epochs": work.epochs, "batch_size": work.batch_size,
            "steps": plan.steps.cpu().numpy(),
        }  # fmt: skip
        data = self.ctx.data
        recorder.updates(self.local_clients, stacked, reference, samples, local, (data.x_train, data.y_train))

    def mean(self, losses: torch.Tensor) -> float:
        """The participants' sample-weighted mean of a per-row value (this process's rows in ``losses``)."""
        return self.cohort.sum_float(float((losses.double().cpu() * self.weights.cpu()).sum()))

    def report(self, losses: torch.Tensor) -> RoundReport:
        """The round's report: the participants' weighted mean training loss (``losses``: this process's
        rows), how many took part and, under an adversary, its figures."""
        return RoundReport(self.mean(losses), {"participants": len(self.clients), **self.figures})


class StarRuntime:
    """Opens the star rounds of an algorithm that samples ``fraction`` of the clients each round and
    trains ``model``: the server holds its initial ``state``, and every device the model's frozen base.
    Under ``privacy.participation: poisson`` each client takes part independently with probability
    ``fraction`` (a round may then have nobody); the run's privacy side is told how clients are drawn
    (what a client-level release records)."""

    def __init__(self, ctx: Context, fraction: float, model: nn.Module, state: Tensors):
        self.ctx, self.fraction = ctx, fraction
        self.poisson = ctx.config.privacy.participation == "poisson"
        ctx.privacy.participation = star_participation(ctx.config, ctx.data.num_clients)
        ctx.network.hold(nodes.SERVER, "model", state)
        hold_frozen_base(ctx.network, [nodes.SERVER, *nodes.clients(range(ctx.data.num_clients))], model)
        self.flops_per_sample = forward_flops(model, ctx.data.input_shape)
        processes = ctx.cohorts.processes
        self.adversary = Adversary.of(ctx.config.adversary, ctx.data, ctx.seed, processes, spread=True)
        cohort = len(sample_clients(ctx.seed, 1, ctx.data.num_clients, fraction))
        if cohort < ctx.cohorts.processes:
            count = f"{cohort} participants for {ctx.cohorts.processes} processes"
            raise ConfigError("algorithm.fraction", count)

    def participants(self, t: int) -> np.ndarray:
        """Round ``t``'s participants, among the clients online in it."""
        ctx = self.ctx
        draw = poisson_clients if self.poisson else sample_clients
        return draw(ctx.seed, t, ctx.data.num_clients, self.fraction, online_clients(ctx.system, t))

    def open(self, t: int) -> StarRound | None:
        """Round ``t``, or None when nobody is online or drawn (the model and the clock then stay as they
        are)."""
        clients = self.participants(t)
        if not len(clients):
            return None
        cohort = self.ctx.cohorts.of(len(clients))
        return StarRound(self.ctx, t, clients, cohort, self.flops_per_sample, self.adversary)
