"""FedAvg (McMahan et al., 2017): sampled clients train locally from the global model, the server
takes their sample-weighted average.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt

from fedge.algorithms.availability import choose, online_clients
from fedge.algorithms.base import Context, GlobalModel, register
from fedge.algorithms.frozen import hold_frozen_base
from fedge.algorithms.optimizer_state import ClientOptimizerStates
from fedge.comm import nodes
from fedge.config import AlgorithmConfig, Fraction, SGDConfig
from fedge.engine import (
    ClientBank,
    buffers_of,
    classification_loss,
    make_optimizer,
    make_step,
    parameters_of,
    weighted_sum,
)
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.rng import numpy_rng
from fedge.system import forward_flops, star_round, training_flops
from fedge.tensors import floating


class FedAvgConfig(AlgorithmConfig):
    """FedAvg knobs: participation, local work, optimizer, and the codecs of each direction."""

    name: Literal["fedavg"] = "fedavg"
    """the algorithm (`fedge list`)"""
    fraction: Fraction = 1.0
    """share of clients sampled each round (at least one)"""
    local_epochs: PositiveInt = 1
    """passes over the client's data per round"""
    batch_size: PositiveInt = 32
    """samples per local step"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    """the clients' local optimizer"""
    client_optimizer_state: Literal["reset", "keep"] = "reset"
    """clients' optimizer state: fresh every round (reset) or each client's own across rounds (keep)"""
    codec_up: Literal["fp32", "fp16"] = "fp32"
    """encoding of the uploaded models"""
    codec_down: Literal["fp32", "fp16"] = "fp32"
    """encoding of the broadcast model"""


def sample_clients(
    seed: int, round_: int, num_clients: int, fraction: float, online: np.ndarray | None = None
) -> np.ndarray:
    """A sorted random subset of ``max(1, round(fraction * n))`` clients, fixed by ``(seed, round)``;
    only the ``online`` ones when given (:mod:`~fedge.algorithms.availability`), as many as there are."""
    count = max(1, round(fraction * num_clients))
    pool = num_clients if online is None else len(online)
    if count >= pool:
        return np.arange(num_clients) if online is None else online.copy()
    return np.sort(choose(numpy_rng(seed, "participants", round_), num_clients, count, False, online))


@register(
    "fedavg", FedAvgConfig, "FedAvg: sampled clients train locally, the server averages by sample count"
)
class FedAvg(GlobalModel):
    """Global model on the server; each round ``fraction`` of clients train ``local_epochs`` epochs.

    Transfers per participant and round: the model down (``model_down``) and the trained model up
    (``model_up``), each encoded by its direction's codec. Floating buffers (BatchNorm statistics)
    travel and are averaged with the parameters; integer counters are not sent. Simulated latency of
    a round (:func:`~fedge.system.star_round`): download, local training and upload one after another
    per client, clients in parallel on their own sub-channels (the slowest client sets the pace).
    """

    state_fields = ("params", "buffers")

    def __init__(self, ctx: Context, cfg: FedAvgConfig):
        super().__init__(ctx, cfg)
        self.model = ctx.build_model().to(ctx.device)
        self.params = parameters_of(self.model)
        self.buffers = buffers_of(self.model)
        opt = cfg.optimizer
        self.sgd = make_optimizer(opt)
        self.client_opt = ClientOptimizerStates(self.sgd, cfg.client_optimizer_state == "keep")
        if self.client_opt.keep:  # the kept states travel in the checkpoint; reset runs' stay as they were
            self.state_fields = (*self.state_fields, "client_opt")
        self.step = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        self.up, self.down = ctx.network.link(cfg.codec_up), ctx.network.link(cfg.codec_down)
        ctx.network.hold(nodes.SERVER, "model", {**self.params, **self.buffers})
        hold_frozen_base(ctx.network, [nodes.SERVER, *nodes.clients(range(ctx.data.num_clients))], self.model)
        self.flops_per_sample = forward_flops(self.model, ctx.data.input_shape)
        cohort = len(sample_clients(ctx.seed, 1, ctx.data.num_clients, cfg.fraction))
        if cohort < ctx.cohorts.processes:
            count = f"{cohort} participants for {ctx.cohorts.processes} processes"
            raise ConfigError("algorithm.fraction", count)

    def run_round(self, t: int) -> RoundReport:
        ctx, cfg = self.ctx, self.cfg
        clients = sample_clients(
            ctx.seed, t, ctx.data.num_clients, cfg.fraction, online_clients(ctx.system, t)
        )
        if not len(clients):  # nobody online: the model and the clock stay as they are
            return RoundReport(0.0, {"participants": 0})
        receivers = nodes.clients(clients)
        model = {**self.params, **floating(self.buffers)}
        down = self.down.send(t, nodes.SERVER, receivers, "model_down", model)
        params = {k: down.payload[k] for k in self.params}
        buffers = {k: down.payload.get(k, v) for k, v in self.buffers.items()}
        cohort = ctx.cohorts.of(len(clients))  # the participants; this process trains its rows of them
        mine = cohort.take(clients)
        if self.client_opt.keep:
            bank = ClientBank.broadcast(mine, params, buffers)
            bank.opt_state = self.client_opt.start(mine, params)  # fresh tensors: the bank owns them
        else:
            bank = ClientBank.broadcast(mine, params, buffers, self.sgd.init(params))
        plan = ctx.data.batch_plan(mine, t, cfg.local_epochs, cfg.batch_size, cfg.drop_last)
        self.model.train()
        losses = ctx.executor.train(self.step, bank, plan, ctx.data, cfg.optimizer.lr)
        self.client_opt.end(clients, bank.opt_state, cohort)  # with keep: for the client's next round
        trained = {**bank.params, **floating(bank.buffers)}
        up = cohort.send(self.up, t, receivers, nodes.SERVER, "model_up", trained)
        samples = cohort.gather_array(plan.weight.sum(dim=(1, 2)).cpu().numpy())
        flops = training_flops(self.flops_per_sample, samples)
        ctx.system.charge(star_round(ctx.system, t, clients, flops, ctx.network.traffic(t)))
        sizes = torch.as_tensor(ctx.data.client_sizes(clients), dtype=torch.float64)
        weights = (sizes / sizes.sum())[cohort.rows].to(ctx.device)
        stacked = {k: up.payload[k] for k in bank.params}
        stacked.update({k: up.payload.get(k, v) for k, v in bank.buffers.items()})
        averaged = cohort.sum(weighted_sum(stacked, weights))  # the processes' partial sums added up
        self.params = {k: averaged[k] for k in self.params}
        self.buffers = {k: averaged[k] for k in self.buffers}
        ctx.network.hold(receivers, "model", {**self.params, **self.buffers})
        train_loss = cohort.sum_float(float((losses.double().cpu() * weights.cpu()).sum()))
        return RoundReport(train_loss, {"participants": len(clients)})
