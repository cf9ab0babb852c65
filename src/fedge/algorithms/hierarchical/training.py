"""Local training inside a cell: the masked SGD step (Eq. 5) and the batch plan of ``H`` local steps.

The masked step runs the engine's pure step and then zeroes every slot a client's cell does not hold, so
the update is ``p_j * grad`` at ``p_j * x`` (Eq. 5). The per-client slot masks travel in the optimizer
state -- the one per-client slot both executors carry through unchanged -- so all clients of all cells
train in one executor call, each on its own cell's submodel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedge.algorithms.hierarchical.masks import HiddenLayer
from fedge.algorithms.hierarchical.submodel import VALID, apply_valid
from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine.step import StepFn


def masked_step(step: StepFn, layout: tuple[HiddenLayer, ...]) -> StepFn:
    """``step`` restricted to each client's submodel; the plain ``step`` when nothing is partitioned."""
    if not layout:
        return step

    def wrapped(params, buffers, opt_state, x, y, weight, lr):
        valid = [opt_state[f"{VALID}{i}"] for i in range(len(layout))]
        inner = {k: v for k, v in opt_state.items() if not k.startswith(VALID)}
        new_params, new_buffers, new_inner, loss = step(params, buffers, inner, x, y, weight, lr)
        masks = {f"{VALID}{i}": v for i, v in enumerate(valid)}
        return apply_valid(new_params, layout, valid), new_buffers, {**new_inner, **masks}, loss

    return wrapped


def local_steps_plan(
    data: FederatedData,
    clients: Sequence[int],
    round_: int,
    edge_round: int,
    steps: int,
    batch_size: int,
    cohort: Sequence[int] | None = None,
) -> BatchPlan:
    """``steps`` minibatches per client from a stream reshuffled every epoch (H counts steps, HIST Eq. 5).

    Epochs come from the stream ``("hist-batches-<edge_round>", round_, client, epoch)``; full batches
    only when every client of the ``cohort`` (default: ``clients``; all clients when a process trains a
    shard of them) has at least one, otherwise each epoch ends with its short batch.
    """
    sizes = data.client_sizes(clients if cohort is None else cohort)
    drop_last = bool(sizes.min() >= batch_size)
    smallest = int(sizes.min())
    per_epoch = smallest // batch_size if drop_last else max(1, math.ceil(smallest / batch_size))
    epochs = math.ceil(steps / per_epoch)
    plan = data.batch_plan(
        clients, round_, epochs, batch_size, drop_last, purpose=f"hist-batches-{edge_round}"
    )
    return BatchPlan(
        clients=plan.clients,
        index=plan.index[:, :steps],
        weight=plan.weight[:, :steps],
        steps=torch.clamp(plan.steps, max=steps),
    )
