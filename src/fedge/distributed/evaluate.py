"""Evaluation of one model on a test set sharded over ranks: each rank scores a block of the rows."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedge.data.federated import FederatedData
from fedge.distributed.cohort import Cohort
from fedge.distributed.group import Group
from fedge.distributed.shards import Shard
from fedge.engine import ClientBank, evaluate_model
from fedge.engine.personal import client_summary, client_test_sets, evaluate_rows
from fedge.metrics import Evaluation
from fedge.tensors import Tensors


def evaluate_sharded(
    group: Group, model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor,
    batch_size: int,
) -> Evaluation:  # fmt: skip
    """:func:`~fedge.engine.evaluate_model` with rows split over ranks; correct counts are summed exactly
    (integers), losses as float64 sums."""
    if not group.distributed:
        return evaluate_model(model, params, buffers, x, y, batch_size)
    shard = group.share(len(y))
    part = evaluate_model(model, params, buffers, x[shard.rows], y[shard.rows], batch_size)
    counts = group.gather_array([round(part.accuracy * len(shard))])
    loss = group.sum_float(part.loss * len(shard))
    total = max(len(y), 1)
    return Evaluation(int(counts.sum()) / total, loss / total)


def evaluate_cohort(
    cohort: Cohort, model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor,
    batch_size: int,
) -> Evaluation:  # fmt: skip
    """:func:`evaluate_sharded` for algorithms that see cohorts: ``cohort`` (``Cohorts.of(len(y))``) says
    which test rows this process scores."""
    if not cohort.spread:
        return evaluate_model(model, params, buffers, x, y, batch_size)
    part = evaluate_model(model, params, buffers, x[cohort.rows], y[cohort.rows], batch_size)
    counts = cohort.gather_array(np.array([round(part.accuracy * len(cohort))]))
    loss = cohort.sum_float(part.loss * len(cohort))
    total = max(len(y), 1)
    return Evaluation(int(counts.sum()) / total, loss / total)


def evaluate_clients_sharded(
    group: Group, model: nn.Module, bank: ClientBank, data: FederatedData, shard: Shard, max_samples: int
) -> Evaluation:
    """Clients ``shard`` (``bank``'s rows, in client order) on their own test sets; every rank's
    per-client figures gathered in client order and summarised as one process does."""
    index, weight = client_test_sets(data)
    acc, loss = evaluate_rows(
        model, bank.params, bank.buffers, data.x_test, data.y_test, index[shard.rows], weight[shard.rows],
        max_samples,
    )  # fmt: skip
    gathered = group.gather_rows({"accuracy": acc, "loss": loss})
    return client_summary(gathered["accuracy"], gathered["loss"])
