"""Evaluation of a decentralized host: every client's model fine-tuned on its own data, then tested.

``accuracy`` is the unweighted mean over clients of each fine-tuned copy's accuracy on its own test
set (the evaluation of AFIND+'s App. C.3); the clients are a cohort (docs/scale-out.md). With
malicious peers (the ``adversary`` block) ``accuracy`` is the honest peers' mean (a poisoner's own model
says nothing) and ``accuracy_all`` every peer's; a backdoor's ``attack_success`` is the honest peers'
mean of their evaluated models' rates on the whole test set.
"""

from __future__ import annotations

from fedge.algorithms.base import Context
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.data.federated import FederatedData
from fedge.distributed.evaluate import evaluate_clients_on
from fedge.engine import ClientBank
from fedge.engine.personal import fine_tuned
from fedge.engine.private_step import without_privacy
from fedge.engine.step import Optimizer, StepFn
from fedge.metrics import Evaluation
from fedge.models import SplitModel
from fedge.runtime.peer_adversary import PeerAdversary
from fedge.runtime.peers import client_block
from fedge.tensors import Tensors


class FineTunedEvaluation:
    """The evaluation half of :class:`~fedge.algorithms.decentralized.common.PeerAlgorithm` (a mixin)."""

    cfg: PeerConfig
    ctx: Context
    model: SplitModel
    train_data: FederatedData
    sgd: Optimizer
    step: StepFn
    bank: ClientBank
    round: int
    adversary: PeerAdversary | None

    def evaluate(self) -> Evaluation:
        return self.evaluate_bank(self.bank)

    def evaluate_bank(
        self, bank: ClientBank, step: StepFn | None = None, extra: Tensors | None = None
    ) -> Evaluation:
        """Fine-tune a copy of every client's model ``ft_epochs`` epochs, then test it on its own test set.

        The clients are a cohort: each process fine-tunes and tests its block of them (docs/scale-out.md).
        """
        cfg, block = self.cfg, client_block(self.ctx, len(bank))
        bank = block.bank(bank)
        extra = None if extra is None else block.rows(extra)
        if cfg.ft_epochs:
            self.model.train()
            copies = ClientBank(bank.clients, dict(bank.params), {**bank.buffers, **(extra or {})})
            bank = fine_tuned(
                self.ctx.executor,
                without_privacy(step or self.step),
                copies,
                self.sgd.init(bank.params, rows=len(bank.clients)),
                self.train_data,
                self.round,
                cfg.ft_epochs,
                cfg.batch_size,
                cfg.optimizer.lr,
                cfg.drop_last,
            )
            own_buffers = {k: v for k, v in bank.buffers.items() if k not in (extra or {})}
            bank.adopt(bank.params, own_buffers, owned=False)
        max_samples = self.ctx.config.eval.batch_size
        if self.adversary is None:
            return evaluate_clients_on(block.cohort, self.model, bank, self.ctx.data, max_samples)
        adversary = self.adversary
        plain = evaluate_clients_on(
            block.cohort, self.model, bank, self.ctx.data, max_samples, adversary.honest
        )
        return plain.with_extra(
            **adversary.success(self.model, bank, self.ctx.data, max_samples, block.cohort)
        )
