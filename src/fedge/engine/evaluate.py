"""Evaluation of a model at explicit parameters: accuracy and mean loss over a set of samples."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedge.data.dataset import IGNORED_TARGET
from fedge.engine.bind import call_at
from fedge.metrics import Evaluation
from fedge.tensors import Tensors


@torch.no_grad()
def evaluate_model(
    model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> Evaluation:
    """Top-1 accuracy and mean cross-entropy of ``model`` (in eval mode) on ``(x, y)``. For token
    sequences (``y`` ``[N, T]``) both are per token (next-token accuracy, token cross-entropy) and the
    perplexity ``exp(loss)`` is added."""
    was_training = model.training
    model.eval()
    correct = 0
    loss_sum = 0.0
    try:
        for start in range(0, len(y), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = call_at(model, {**params, **buffers}, (xb,))
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    finally:
        model.train(was_training)
    return evaluation(correct, loss_sum, y)


def target_count(y: torch.Tensor) -> int:
    """Targets that count in ``y``: every label, or every token of a sequence but a padded one's
    :data:`~fedge.data.dataset.IGNORED_TARGET` positions (which no cross-entropy reads and no argmax
    matches)."""
    return y.numel() if y.dim() == 1 else int(y.ne(IGNORED_TARGET).sum())


def evaluation(correct: int, loss_sum: float, y: torch.Tensor) -> Evaluation:
    """Accuracy and mean loss from the counts over the targets ``y`` (per real token for sequences, with
    the perplexity ``exp(loss)``)."""
    count = max(target_count(y), 1)
    loss = loss_sum / count
    if y.dim() == 1:
        return Evaluation(correct / count, loss)
    return Evaluation(correct / count, loss, {"perplexity": math.exp(min(loss, 700.0))})
