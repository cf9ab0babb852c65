"""FedAvg (McMahan et al., 2017): sampled clients train locally from the global model, the server
takes their sample-weighted average.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from fedge.algorithms.base import Context, GlobalModel, register
from fedge.algorithms.frozen import hold_frozen_base
from fedge.algorithms.optimizer_state import ClientOptimizerStates
from fedge.comm import nodes
from fedge.config import AlgorithmConfig, Fraction, SGDConfig
from fedge.engine import buffers_of, classification_loss, make_optimizer, make_step, parameters_of
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.runtime import StarRuntime, sample_clients
from fedge.system import forward_flops


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


@register(
    "fedavg", FedAvgConfig, "FedAvg: sampled clients train locally, the server averages by sample count"
)
class FedAvg(GlobalModel[FedAvgConfig]):
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
        self.rounds = StarRuntime(ctx, cfg.fraction)
        cohort = len(sample_clients(ctx.seed, 1, ctx.data.num_clients, cfg.fraction))
        if cohort < ctx.cohorts.processes:
            count = f"{cohort} participants for {ctx.cohorts.processes} processes"
            raise ConfigError("algorithm.fraction", count)

    def run_round(self, t: int) -> RoundReport:
        cfg = self.cfg
        rnd = self.rounds.open(t)
        if rnd is None:  # nobody online: the model and the clock stay as they are
            return RoundReport(0.0, {"participants": 0})
        params, buffers = rnd.broadcast(self.down, self.params, self.buffers)
        bank = self.client_opt.bank(rnd.mine, params, buffers)
        plan = rnd.plan(cfg.local_epochs, cfg.batch_size, cfg.drop_last)
        self.model.train()
        losses = rnd.train(self.step, bank, plan, cfg.optimizer.lr)
        self.client_opt.end(rnd.clients, bank.opt_state, rnd.cohort)  # with keep: for the client's next round
        trained = rnd.collect(self.up, bank)
        rnd.charge(self.flops_per_sample, plan)
        averaged = rnd.aggregate(trained, {**params, **buffers})
        self.params = {k: averaged[k] for k in self.params}
        self.buffers = {k: averaged[k] for k in self.buffers}
        rnd.hold({**self.params, **self.buffers})
        return RoundReport(rnd.mean(losses), {"participants": len(rnd.clients)})
