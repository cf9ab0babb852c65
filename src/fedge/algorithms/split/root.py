"""FLTrust at the split server's client-model average (Cao et al., NDSS 2021): before each average the
server trains its own root update of the client model and hands it to its ``fltrust`` reducer, which
scores the uploaded client models against it (:mod:`fedge.aggregation.fltrust`).

The root set is the star server's: ``root_samples`` samples drawn once from the whole training pool by
``(seed, "fltrust-root")`` (:func:`fedge.runtime.root.root_indices`), clean labels. The root training
starts from the client model the server broadcast (the reference of the average) and runs through the
composed model: the trunk feeds the server part as it stands at the start of the aggregation, held fixed
(the root training never changes the server's model, only the trunk learns from the composed loss);
where the algorithm has an aux head it learns alongside from its own loss on the trunk's output
(detached, as a local-loss client's head). It uses the clients' optimizer (a fresh state) and learning
rate of the round, batch size and ``drop_last``, for as many steps as a client trains between averages:
``agg_every`` steps, else ``local_steps``, else ``local_epochs`` passes (``root_epochs`` and ``lr``
override). The ``k``-th average of round ``t`` draws its batches from ``(seed,
"fltrust-root-batches-<k>", t, 0, epoch)``; it runs on the run's executor as one row keyed as client
``num_clients``. Its FLOPs (forward and backward passes of trunk, server part and aux head) are charged to
the server with the aggregation's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.algorithms.base import Context
from fedge.algorithms.split.config import SplitConfig
from fedge.algorithms.split.cost import count_flops
from fedge.algorithms.split.parts import SplitParts
from fedge.algorithms.split.plans import limit_steps
from fedge.engine import ClientBank, make_step
from fedge.engine.bind import call_at
from fedge.engine.step import Optimizer, weighted_mean
from fedge.runtime.root import root_indices
from fedge.system import training_flops
from fedge.tensors import Tensors


def _strip(tensors: Tensors, prefix: str) -> Tensors:
    """The entries of ``tensors`` under ``prefix``, the prefix removed."""
    return {name[len(prefix) :]: t for name, t in tensors.items() if name.startswith(prefix)}


@dataclass(frozen=True)
class RootLoss:
    """The root training's loss (a :data:`~fedge.engine.step.LossFn` over the client state): the
    composed model's loss with the server part fixed at ``server``, plus the aux head's own loss on the
    detached smashed data where ``parts`` has one."""

    parts: SplitParts
    server: Tensors

    def __call__(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, Tensors]:
        parts = self.parts
        new_buffers = {name: b.clone() for name, b in buffers.items()}
        trunk = {**_strip(params, "trunk."), **_strip(new_buffers, "trunk.")}
        z = call_at(parts.trunk, trunk, (x,))
        server = {name: t.clone() for name, t in self.server.items()}  # its statistics left as they are
        loss = weighted_mean(parts.criterion(call_at(parts.server, server, (z,)), y), weight)
        if parts.has_aux:
            aux = {**_strip(params, "aux."), **_strip(new_buffers, "aux.")}
            loss = loss + weighted_mean(parts.criterion(call_at(parts.aux, aux, (z.detach(),)), y), weight)
        return loss, new_buffers


def split_root_update(
    ctx: Context,
    cfg: SplitConfig,
    parts: SplitParts,
    reducer: FLTrust,
    sgd: Optimizer,
    work: tuple[int, int, float],
    client: tuple[Tensors, Tensors],
    server: Tensors,
) -> RootUpdate:
    """The server's root model of one client-model average (see the module): ``work`` is the round,
    the average's index in it and the clients' learning rate; ``client`` the broadcast client model
    (parameters, buffers), ``server`` the server part's state."""
    data, key = ctx.data, reducer.run.key
    t, k, lr = work
    root = data.holding(root_indices(ctx.seed, len(data.x_train), reducer.root_samples, key))
    steps, epochs = cfg.agg_every or cfg.local_steps, cfg.local_epochs
    batch, drop_last = cfg.batch_size, cfg.drop_last
    if reducer.root_epochs is not None:
        epochs, steps = reducer.root_epochs, None
    elif steps is not None:
        count = reducer.root_samples
        per_epoch = count // batch if drop_last else -(-count // batch)
        epochs = math.ceil(steps / max(per_epoch, 1))
    plan = root.batch_plan([0], t, epochs, batch, drop_last, f"fltrust-root-batches-{k}")
    if steps is not None:
        plan = limit_steps(plan, np.array([steps]))
    params, buffers = client
    step = make_step(RootLoss(parts, server), sgd)
    bank = ClientBank.broadcast([data.num_clients], params, buffers, sgd.init(params))
    ctx.executor.train(step, bank, plan, root, lr if reducer.lr is None else reducer.lr)
    trained = {name: rows[0] for name, rows in {**bank.params, **bank.buffers}.items()}
    forward = count_flops(parts)
    flops = training_flops(forward.trunk + forward.server + forward.aux, float(plan.weight.sum()))
    return RootUpdate(trained, float(flops))
