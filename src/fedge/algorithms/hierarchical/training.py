"""Local training inside a cell: the masked SGD step (Eq. 5) and the batch plan of ``H`` local steps.

The masked step is the engine's step with an optimizer that zeroes every slot a client's cell does not
hold after each update, so the update is ``p_j * grad`` at ``p_j * x`` (Eq. 5). The per-client slot
masks travel in the optimizer state -- the one per-client slot both executors carry through unchanged
-- so all clients of all cells train in one executor call, each on its own cell's submodel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from fedge.algorithms.hierarchical.masks import HiddenLayer
from fedge.algorithms.hierarchical.submodel import VALID, apply_valid, apply_valid_
from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine.private_step import PrivateStep
from fedge.engine.step import Optimizer, Step
from fedge.tensors import Tensors


@dataclass(frozen=True)
class MaskedOptimizer:
    """``inner``'s update followed by zeroing every slot the client's cell does not hold (Eq. 5).

    The slot masks ride in the optimizer state under :data:`VALID` names and pass through unchanged.
    Being an optimizer (with the in-place ``update_``) rather than a wrapped step function keeps a
    masked step a :class:`~fedge.engine.step.Step`, which both executors run on their fast paths
    (in-place update of the stacked state) as they run the plain step for equal cells.
    """

    inner: Optimizer
    layout: tuple[HiddenLayer, ...]

    def _split(self, state: Tensors) -> tuple[list[torch.Tensor], Tensors]:
        valid = [state[f"{VALID}{i}"] for i in range(len(self.layout))]
        return valid, {k: v for k, v in state.items() if not k.startswith(VALID)}

    def init(self, params: Tensors, rows: int | None = None) -> Tensors:
        return self.inner.init(params, rows)

    def select(self, state: Tensors, names: Iterable[str]) -> Tensors:
        return self.inner.select(state, names)

    def update(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> tuple[Tensors, Tensors]:
        valid, inner = self._split(state)
        new_params, new_inner = self.inner.update(params, grads, inner, lr)
        masks = {f"{VALID}{i}": v for i, v in enumerate(valid)}
        return apply_valid(new_params, self.layout, valid), {**new_inner, **masks}

    def update_(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> None:
        valid, inner = self._split(state)
        self.inner.update_(params, grads, inner, lr)
        apply_valid_(params, self.layout, valid)


def masked_step(step: Step | PrivateStep, layout: tuple[HiddenLayer, ...]) -> Step | PrivateStep:
    """``step`` restricted to each client's submodel; the plain ``step`` when nothing is partitioned.
    A DP-SGD step stays one: the clip bounds each sample's gradient over every slot, held or not, and
    the mask then zeroes the noise on the slots a cell does not hold (post-processing)."""
    if not layout:
        return step
    if isinstance(step, PrivateStep):
        return replace(step, optimizer=MaskedOptimizer(step.optimizer, layout))
    return Step(step.loss_fn, MaskedOptimizer(step.optimizer, layout))


def local_steps_plan(
    data: FederatedData,
    clients: Sequence[int],
    round_: int,
    edge_round: int,
    steps: int,
    batch_size: int,
    cohort: Sequence[int] | None = None,
    purpose: str = "hist-batches",
) -> BatchPlan:
    """``steps`` minibatches per client from a stream reshuffled every epoch (H counts steps, HIST Eq. 5).

    Epochs come from the stream ``("<purpose>-<edge_round>", round_, client, epoch)``; full batches
    only when every client of the ``cohort`` (default: ``clients``; all clients when a process trains
    some of them) has at least one, otherwise each epoch ends with its short batch.
    """
    sizes = data.client_sizes(clients if cohort is None else cohort)
    drop_last = bool(sizes.min() >= batch_size)
    smallest = int(sizes.min())
    per_epoch = smallest // batch_size if drop_last else max(1, math.ceil(smallest / batch_size))
    epochs = math.ceil(steps / per_epoch)
    plan = data.batch_plan(clients, round_, epochs, batch_size, drop_last, purpose=f"{purpose}-{edge_round}")
    return BatchPlan(
        clients=plan.clients,
        index=plan.index[:, :steps],
        weight=plan.weight[:, :steps],
        steps=torch.clamp(plan.steps, max=steps),
    )
