"""FedAvg-FT (Cheng et al. 2021, "fine-tuning is fine"): server FedAvg, then each client fine-tunes.

The centralized reference of the AFIND+ tables (the FedAvg row of Table 1, and FedAvg-FT of App. C.3): the
server samples ``fraction`` of the clients (0.1 by default, 10 of 100), they train ``local_epochs`` epochs
from the global model and the server averages by sample count. Evaluation fine-tunes the global model
``ft_epochs`` epochs on each client's data and tests it on that client's test set; ``global_accuracy`` is the
same mean for the global model without fine-tuning (the "FedAvg" row).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.config import paper_optimizer
from fedge.algorithms.fedavg import FedAvg, FedAvgConfig
from fedge.config import Fraction, SGDConfig
from fedge.distributed.evaluate import evaluate_clients_on
from fedge.engine import ClientBank
from fedge.engine.personal import fine_tuned
from fedge.engine.private_step import without_privacy
from fedge.metrics import Evaluation, RoundReport
from fedge.runtime.peers import client_block


class FedAvgFTConfig(FedAvgConfig):
    """FedAvg's knobs with the AFIND+ paper's defaults, plus the fine-tune epochs before evaluation."""

    name: Literal["fedavg_ft"] = "fedavg_ft"  # type: ignore[assignment]
    """the algorithm (`fedge list`)"""
    fraction: Fraction = 0.1
    """share of clients sampled each round"""
    local_epochs: PositiveInt = 5
    """passes over the client's data per round"""
    optimizer: SGDConfig = Field(default_factory=paper_optimizer)
    """the clients' local optimizer"""
    ft_epochs: NonNegativeInt = 1
    """fine-tuning epochs of each client's copy before it is evaluated"""


@register("fedavg_ft", FedAvgFTConfig, "FedAvg-FT: server FedAvg, each client fine-tunes before its test")
class FedAvgFT(FedAvg):
    """FedAvg whose evaluation is personalised: per-client fine-tune and per-client test sets."""

    cfg: FedAvgFTConfig
    state_fields = (*FedAvg.state_fields, "round")

    def __init__(self, ctx: Context, cfg: FedAvgFTConfig):
        super().__init__(ctx, cfg)
        self.round = 0

    def run_round(self, t: int) -> RoundReport:
        self.round = t
        return super().run_round(t)

    def evaluate(self) -> Evaluation:
        """The global model, then its fine-tuned copies, on every client's test set; the clients are a
        cohort: each process fine-tunes and tests its block of them (docs/scale-out.md)."""
        cfg, data = self.cfg, self.ctx.data
        block = client_block(self.ctx, data.num_clients)
        bank = ClientBank.broadcast(block.clients, self.params, self.buffers)
        max_samples = self.ctx.config.eval.batch_size
        plain = evaluate_clients_on(block.cohort, self.model, bank, data, max_samples)
        self.model.train()
        tuned = fine_tuned(
            self.ctx.executor,
            without_privacy(self.step),
            bank,
            self.sgd.init(bank.params, rows=len(bank.clients)),
            data,
            self.round,
            cfg.ft_epochs,
            cfg.batch_size,
            cfg.optimizer.lr,
            cfg.drop_last,
        )
        return evaluate_clients_on(block.cohort, self.model, tuned, data, max_samples).with_extra(
            global_accuracy=plain.accuracy, **self.attack_figures()
        )
