"""The client model's way down and up in a split round: the broadcast to the participants and the upload
and weighted average of what they trained (the SplitFed convergence paper's Algorithm 1, with its global
step size eta_g; CSE-FSL Eq. 14).

The parts that travel are the trunk and, when it is shared, the aux head (``model_down``/``aux_down``,
``model_up``/``aux_up``). Unshared aux heads stay on their clients: each row starts from its client's own
head (the initial one on a first visit), nothing about them is sent, and each client keeps the mean of
its rows' heads. On several processes every process sends the whole broadcast (one encoding for all
rows) and stacks its own rows; each uploads and sums its own rows and one all-reduce adds the sums (as
FedAvg); unshared heads are gathered, so every process keeps every client's.

Under an ``adversary``, the malicious rows' uploads are poisoned as the server received them, before its
pipeline (on several processes each poisons its own rows with the round's counts), and the round's
figures (``malicious``, ``malicious_kept``) read that pipeline's reducer
(:mod:`~fedge.runtime.split_adversary`).

Evaluation composes the global client model with the server's model (:func:`evaluate_split`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedge.aggregation import sites
from fedge.algorithms.base import Context
from fedge.algorithms.split.parts import SplitParts, aux_only, composed, trunk_only
from fedge.algorithms.split.round import Round
from fedge.comm import Link, nodes, state_bits
from fedge.distributed.evaluate import evaluate_model_on
from fedge.engine import stack_copies
from fedge.metrics import Evaluation
from fedge.runtime.split import SplitRuntime
from fedge.runtime.split_adversary import SplitAdversary
from fedge.tensors import Tensors, floating

Part = Callable[[Tensors], Tensors]
ClientState = dict[str, Tensors]  # {"params": ..., "buffers": ...}


class ClientModels:
    """Broadcast, upload and averaging of the global client model through the links ``up`` and ``down``
    (the transfers, the server's aggregation and the storage by the split ``runtime``)."""

    def __init__(
        self,
        runtime: SplitRuntime,
        up: Link,
        down: Link,
        shares_aux: bool,
        global_lr: float,
        device: torch.device,
    ):
        self.runtime, self.up, self.down, self.shares_aux = runtime, up, down, shares_aux
        self.global_lr, self.device = global_lr, device
        self.adversary: SplitAdversary | None = None  # malicious clients' client models
        self.figures: dict[str, Any] = {}  # the adversary's, at the last average

    def parts(self) -> list[tuple[str, Part]]:
        """The parts of the client model that travel, by name: the trunk, and the aux head if shared."""
        parts: list[tuple[str, Part]] = [("model", trunk_only)]
        return [*parts, ("aux", aux_only)] if self.shares_aux else parts

    def download(self, rnd: Round, client: ClientState, local_aux: dict[int, Tensors]) -> None:
        """Broadcast ``client`` to every row and stack this process's rows into the round's state."""
        params, buffers = client["params"], client["buffers"]
        received: Tensors = {}
        for name, part in self.parts():
            sent = {**part(params), **floating(part(buffers))}
            if sent:
                down = self.runtime.broadcast(self.down, rnd.t, rnd.nodes, f"{name}_down", sent)
                rnd.tally.down_bits += down.bits[0]
                received.update(down.payload)
        mine = self.runtime.local_clients(rnd.cohort, rnd.draws.clients)
        count = len(mine)
        stacked = stack_copies({k: received.get(k, v) for k, v in params.items()}, count)
        if not self.shares_aux:
            for name in aux_only(params):
                stacked[name] = torch.stack([local_aux.get(int(c), params)[name] for c in mine])
        rnd.rows.adopt(
            stacked, stack_copies({k: received.get(k, v) for k, v in buffers.items()}, count), owned=False
        )

    def aggregate(self, rnd: Round, old: ClientState, local_aux: dict[int, Tensors]) -> ClientState:
        """Upload every row's client model and average it with the round weights: the new global model
        is ``old + global_lr * (average - old)`` (1: the plain average). Unshared heads go to
        ``local_aux``."""
        return self.average(rnd, self.upload(rnd), old, local_aux)

    def average(
        self, rnd: Round, uploaded: Tensors, old: ClientState, local_aux: dict[int, Tensors]
    ) -> ClientState:
        """The new global model from the rows' ``uploaded`` parts (see :meth:`aggregate`), through the
        server's aggregation pipeline (by default the round weights' mean); an adversary's rows poisoned
        first."""
        weights, reference = self.runtime.row_weights(rnd), {**old["params"], **old["buffers"]}
        adversary = self.adversary
        if adversary is not None:
            uploaded = adversary.poison(rnd.t, rnd.draws.clients, uploaded, reference, rnd.cohort)
        params = {k: uploaded.get(k, v) for k, v in rnd.rows.params.items()}
        buffers = {k: uploaded.get(k, v) for k, v in rnd.rows.buffers.items()}
        average = self.runtime.aggregate(rnd.t, rnd.cohort, {**params, **buffers}, weights, reference)
        if adversary is not None:
            pipeline = self.runtime.ctx.pipeline(sites.SERVER)
            self.figures = adversary.figures(rnd.t, rnd.draws.clients, rnd.weights, pipeline)
        before, step = old["params"], self.global_lr
        new = {k: average[k] if step == 1.0 else before[k] + step * (average[k] - before[k]) for k in params}
        if not self.shares_aux:
            self._keep_heads(rnd, aux_only(params), local_aux)
            new.update(aux_only(before))
        return {"params": new, "buffers": {k: average[k] for k in buffers}}

    def upload(self, rnd: Round) -> Tensors:
        """This process's rows' travelling parts as the server receives them."""
        uploaded: Tensors = {}
        for name, part in self.parts():
            sent = {**part(rnd.rows.params), **floating(part(rnd.rows.buffers))}
            if sent:
                up = self.runtime.collect(rnd, self.up, f"{name}_up", sent)
                rnd.tally.up_bits += up.bits
                uploaded.update(up.payload)
        return uploaded

    def _keep_heads(self, rnd: Round, heads: Tensors, local_aux: dict[int, Tensors]) -> None:
        """Each drawn client keeps the mean of its rows' aux heads (every process keeps every client's): a
        client's own copies from one round, never sent, so no node's aggregation pipeline sees them."""
        heads = self.runtime.gather(rnd.cohort, heads) if heads else heads
        for client in np.unique(rnd.draws.clients):
            mine = torch.as_tensor(np.flatnonzero(rnd.draws.clients == client), device=self.device)
            local_aux[int(client)] = {k: heads[k][mine].mean(dim=0) for k in heads}

    def store(self, client: ClientState, count: int, participants: list[str]) -> None:
        """The server holds the ``count`` uploads it averages; each participant its trunk and aux head."""
        params, buffers = client["params"], client["buffers"]
        trunk_bits = state_bits({**trunk_only(params), **trunk_only(buffers)})
        aux_bits = state_bits({**aux_only(params), **aux_only(buffers)})
        uploaded = trunk_bits + (aux_bits if self.shares_aux else 0)
        self.runtime.store(nodes.SERVER, "client_models", count * uploaded)
        self.runtime.store(participants, "model", trunk_bits)
        if aux_bits:
            self.runtime.store(participants, "aux", aux_bits)


def evaluate_split(
    ctx: Context,
    parts: SplitParts,
    client: ClientState,
    server: tuple[Tensors, Tensors],
    aux: bool,
    adversary: SplitAdversary | None = None,
) -> Evaluation:
    """The global client model composed with the server's evaluation ``server`` (parameters, buffers) on
    the global test set; with ``aux`` also the accuracy and loss of trunk + aux head; under a backdoor
    the composed model's ``attack_success`` (on the whole test set, on every process). On several
    processes each scores a block of the test rows."""
    data, batch = ctx.data, ctx.config.eval.batch_size
    test = ctx.cohorts
    params, buffers = composed(client["params"], server[0]), composed(client["buffers"], server[1])
    evaluation = evaluate_model_on(test, parts.model, params, buffers, data.x_test, data.y_test, batch)
    if adversary is not None:
        evaluation = evaluation.with_extra(**adversary.success(parts.model, params, buffers, data, batch))
    if not aux:
        return evaluation
    local = evaluate_model_on(
        test, parts.local, client["params"], client["buffers"], data.x_test, data.y_test, batch
    )
    return evaluation.with_extra(aux_accuracy=local.accuracy, aux_loss=local.loss)
