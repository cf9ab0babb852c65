"""Centralized training: one learner on the pooled training data, the reference for every FL run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from fedge.algorithms.base import Algorithm, Context, register
from fedge.config import AlgorithmConfig, SGDConfig
from fedge.engine import (
    ClientBank,
    buffers_of,
    classification_loss,
    evaluate_model,
    make_optimizer,
    make_step,
    parameters_of,
)
from fedge.metrics import Evaluation, RoundReport
from fedge.runtime.server import ServerRuntime


class CentralizedConfig(AlgorithmConfig):
    """Epochs per round, batch size and optimizer of the single learner."""

    name: Literal["centralized"] = "centralized"
    """the algorithm (`fedge list`)"""
    epochs_per_round: PositiveInt = 1
    """passes over the pooled data per round"""
    batch_size: PositiveInt = 32
    """samples per step"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    """the learner's optimizer"""


@register("centralized", CentralizedConfig, "Centralized SGD on the pooled training data (the reference)")
class Centralized(Algorithm[CentralizedConfig]):
    """SGD on the union of the clients' training samples; a round is ``epochs_per_round`` epochs.

    It runs through the same engine as the federated algorithms (a bank of one client), so its numbers
    are directly comparable; it sends nothing, so its ledger stays empty apart from storage, and its
    simulated time is the server's compute time.
    """

    state_fields = ("bank",)

    def reads_run_length(self) -> str | None:
        return None  # no round reads config.rounds

    def __init__(self, ctx: Context, cfg: CentralizedConfig):
        super().__init__(ctx, cfg)
        self.data = ctx.data.pooled()
        self.model = ctx.build_model().to(ctx.device)
        self.sgd = make_optimizer(cfg.optimizer)
        params = parameters_of(self.model)
        self.bank = ClientBank.broadcast([0], params, buffers_of(self.model), self.sgd.init(params))
        self.step = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        self.server = ServerRuntime(ctx, self.model, {**params, **buffers_of(self.model)})

    def run_round(self, t: int) -> RoundReport:
        cfg = self.cfg
        plan = self.data.batch_plan([0], t, cfg.epochs_per_round, cfg.batch_size, cfg.drop_last)
        self.model.train()
        losses = self.ctx.executor.train(self.step, self.bank, plan, self.data, cfg.optimizer.lr)
        self.server.close(plan)
        return RoundReport(float(losses[0]))

    def evaluate(self) -> Evaluation:
        params, buffers = self.bank.client(0)
        data = self.ctx.data
        return evaluate_model(
            self.model, params, buffers, data.x_test, data.y_test, self.ctx.config.eval.batch_size
        )
