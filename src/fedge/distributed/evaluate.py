"""Evaluation of one model on a test set sharded over ranks: each rank scores a block of the rows."""

from __future__ import annotations

import torch
from torch import nn

from fedge.distributed.group import Group
from fedge.engine import evaluate_model
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
