"""FedAvg (McMahan et al., 2017): sampled clients train locally from the global model, the server
takes their sample-weighted average.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from fedge.algorithms.base import Context, GlobalModel, register
from fedge.algorithms.optimizer_state import ClientOptimizerStates
from fedge.config import AlgorithmConfig, Fraction, SGDConfig
from fedge.engine import buffers_of, classification_loss, make_optimizer, make_step, parameters_of
from fedge.engine.private_step import private_step
from fedge.metrics import Evaluation, RoundReport
from fedge.runtime import StarRuntime


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

    state_fields: tuple[str, ...] = ("params", "buffers")
    recorded = frozenset({"updates"})

    def __init__(self, ctx: Context, cfg: FedAvgConfig):
        super().__init__(ctx, cfg)
        self.model = ctx.build_model().to(ctx.device)
        self.params = parameters_of(self.model)
        self.buffers = buffers_of(self.model)
        self.sgd = make_optimizer(cfg.optimizer)
        self.client_opt = ClientOptimizerStates(self.sgd, cfg.client_optimizer_state == "keep")
        if self.client_opt.keep:  # the kept states travel in the checkpoint; reset runs' stay as they were
            self.state_fields = (*self.state_fields, "client_opt")
        plain = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        self.step = private_step(plain, ctx.privacy, self.model)
        self.up, self.down = ctx.network.link(cfg.codec_up), ctx.network.link(cfg.codec_down)
        self.rounds = StarRuntime(ctx, cfg.fraction, self.model, {**self.params, **self.buffers})

    def run_round(self, t: int) -> RoundReport:
        rnd = self.rounds.open(t)
        if rnd is None:  # nobody online: the model and the clock stay as they are
            return RoundReport(0.0, {"participants": 0})
        params, buffers = rnd.broadcast(self.down, self.params, self.buffers)
        bank = self.client_opt.bank(rnd.local_clients, params, buffers)
        plan = rnd.plan(self.cfg.local_epochs, self.cfg.batch_size, self.cfg.drop_last)
        self.model.train()
        losses = rnd.train(self.step, bank, plan, self.cfg.optimizer.lr, self.client_opt)
        trained = rnd.collect(self.up, bank)
        self.params, self.buffers = rnd.aggregate(trained, params, buffers)
        rnd.close(plan)  # after the aggregation: a stage's own messages (secagg's) are the round's too
        return rnd.report(losses)

    def evaluate(self) -> Evaluation:
        return super().evaluate().with_extra(**self.attack_figures())

    def attack_figures(self) -> dict[str, float]:
        """The adversary's figures of the global model (a backdoor's attack success rate), or none."""
        adversary, ctx = self.rounds.adversary, self.ctx
        if adversary is None:
            return {}
        return adversary.success(self.model, self.params, self.buffers, ctx.data, ctx.config.eval.batch_size)
