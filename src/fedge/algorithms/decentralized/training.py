"""Local training of a decentralized host's clients: the round's local update and the probe losses.

Rows of client state train through the run's executor, one call per phase (two in alternating mode:
head, then body); probe-batch losses score models on a client's probe batch. Both run on a cohort of
rows (:meth:`LocalTraining.map_rows`), so every process holds every result and tallies the whole
round's compute into the host's :class:`~fedge.system.RoundWork`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from fedge.algorithms.base import Context
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.probes import ProbeBatches, pair_losses
from fedge.data.federated import FederatedData
from fedge.engine import ClientBank
from fedge.engine.step import Optimizer, StepFn
from fedge.models import SplitModel
from fedge.runtime.peer_adversary import PeerAdversary
from fedge.runtime.peers import PeerRound
from fedge.tensors import Tensors

Trained = tuple[Tensors, Tensors, torch.Tensor]
"""Trained params, buffers and per-row losses of a set of rows."""
TrainFn = Callable[[Tensors, Tensors, Sequence[int], Tensors | None], Trained]
"""A local update of rows: ``(params, buffers, owners, extra) -> (params, buffers, losses)``."""


class LocalTraining:
    """The local-update half of :class:`~fedge.algorithms.decentralized.common.PeerAlgorithm` (a mixin:
    it reads the host's model, optimizer, data and round work)."""

    cfg: PeerConfig
    ctx: Context
    model: SplitModel
    train_data: FederatedData
    sgd: Optimizer
    step: StepFn
    head: set[str]
    private: set[str]
    this_round: PeerRound
    round: int
    adversary: PeerAdversary | None

    def probe_data(self, t: int) -> FederatedData:
        """The data round ``t``'s probes read: the run's, or a backdoor's stamped view where malicious peers
        poison their probe answers (:meth:`~fedge.runtime.peer_adversary.PeerAdversary.probed`)."""
        return self.ctx.data if self.adversary is None else self.adversary.probed(t, self.ctx.data)

    def count_probes(self, clients: torch.Tensor, batches: ProbeBatches, backward: bool) -> None:
        """Tally one pass over their probe batch by each of ``clients`` (backward too if ``backward``)."""
        samples = batches.weight[clients].sum(dim=1)
        self.this_round.work.compute(clients.cpu().numpy(), samples.double().cpu().numpy(), backward)

    def _pair_losses(
        self,
        params: Tensors,
        buffers: Tensors,
        pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        batches: ProbeBatches,
    ) -> torch.Tensor:
        """Probe-batch losses of rows ``(shared_from, private_from, data_from)`` (see ``pair_losses``),
        each a forward pass by the client ``data_from`` whose batch it uses (in this process)."""
        self.count_probes(pairs[2], batches, backward=False)
        data = self.probe_data(self.round)
        return pair_losses(self.model, params, buffers, self.private, pairs, data, batches)

    def train_rows(
        self,
        params: Tensors,
        buffers: Tensors,
        owners: Sequence[int],
        t: int,
        step: StepFn | None = None,
        extra: Tensors | None = None,
        purpose: str = "batches",
    ) -> tuple[Tensors, Tensors, torch.Tensor]:
        """Train rows (row r on client ``owners[r]``'s data) for the round's local epochs, one executor call
        per phase (two in alternating mode). ``extra`` tensors ride along as constants (anchors, masks)."""
        cfg = self.cfg
        self.model.train()
        if cfg.local_update == "joint":
            return self._train(
                params, buffers, owners, t, cfg.local_epochs, set(params), step, extra, purpose
            )
        params, buffers, _ = self._train(
            params, buffers, owners, t, cfg.head_epochs, self.head, step, extra, f"{purpose}-head"
        )
        body = set(params) - self.head
        epochs = cfg.local_epochs - cfg.head_epochs
        return self._train(params, buffers, owners, t, epochs, body, step, extra, purpose)

    def local_update(
        self,
        params: Tensors,
        buffers: Tensors,
        owners: Sequence[int],
        t: int,
        extra: Tensors | None = None,
        train: TrainFn | None = None,
    ) -> tuple[Tensors, Tensors, torch.Tensor]:
        """The round's local update of rows (row r on client ``owners[r]``'s data): :meth:`train_rows`,
        or ``train(params, buffers, owners, extra)`` (Ditto's personal models).

        The rows are a cohort (:meth:`map_rows`): each process trains its rows (and their per-row
        ``extra`` constants) and every process gets every trained row and loss, in row order, and the
        whole round's compute tally. Noise keys and batch plans are per client, so a row trains as it
        would in one process.
        """
        train = train or (lambda p, b, o, e: self.train_rows(p, b, o, t, extra=e))

        def process_rows(rows: slice) -> Tensors:
            def take(tensors: Tensors) -> Tensors:
                return {k: v[rows] for k, v in tensors.items()}

            new_p, new_b, losses = train(
                take(params), take(buffers), list(owners)[rows], None if extra is None else take(extra)
            )
            return {**new_p, **new_b, "\0loss": losses}

        trained = self.map_rows(len(owners), process_rows)
        return {k: trained[k] for k in params}, {k: trained[k] for k in buffers}, trained["\0loss"]

    def losses_on(
        self,
        params: Tensors,
        buffers: Tensors,
        pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        batches: ProbeBatches,
    ) -> torch.Tensor:
        """Probe-batch losses of rows ``(shared_from, private_from, data_from)``, each a forward pass by
        the client ``data_from`` whose batch it uses; the pairs are a cohort (:meth:`map_rows`; each
        pair's forward pass is independent of the others): the scoring of received models by PENS,
        FedeRiCo and FedFomo, and AFIND+'s probe losses before and after training (Eq. 15)."""

        def process_rows(rows: slice) -> Tensors:
            return {
                "loss": self._pair_losses(
                    params, buffers, (pairs[0][rows], pairs[1][rows], pairs[2][rows]), batches
                )
            }

        return self.map_rows(len(pairs[0]), process_rows)["loss"]

    def map_rows(self, total: int, work: Callable[[slice], Tensors]) -> Tensors:
        """``work(rows)`` on this process's rows of a cohort of ``total`` rows (all of them in one
        process); its tensors (rows in dimension 0) come back in row order and the compute it tallied is
        the whole cohort's, so every process holds every row and charges the clock the same work
        (docs/scale-out.md)."""
        return self.this_round.map(total, work)

    def _train(
        self,
        params: Tensors,
        buffers: Tensors,
        owners: Sequence[int],
        t: int,
        epochs: int,
        trainable: set[str],
        step: StepFn | None,
        extra: Tensors | None,
        purpose: str,
    ) -> tuple[Tensors, Tensors, torch.Tensor]:
        """One executor call; parameters outside ``trainable`` ride along with the buffers, frozen."""
        cfg = self.cfg
        train = {k: v for k, v in params.items() if k in trainable}
        frozen = {k: v for k, v in params.items() if k not in trainable}
        bank = ClientBank(tuple(int(o) for o in owners), train, {**buffers, **frozen, **(extra or {})})
        bank.opt_state = self.sgd.init(train, rows=len(owners))
        plan = self.train_data.batch_plan(bank.clients, t, epochs, cfg.batch_size, cfg.drop_last, purpose)
        samples = plan.weight.sum(dim=(1, 2)).double().cpu().numpy()
        self.this_round.work.compute(np.asarray(bank.clients), samples, backward=True)
        losses = self.ctx.executor.train(step or self.step, bank, plan, self.train_data, cfg.optimizer.lr)
        new_params = {k: bank.params[k] if k in train else bank.buffers[k] for k in params}
        new_buffers = {k: bank.buffers[k] for k in buffers}
        return new_params, new_buffers, losses
