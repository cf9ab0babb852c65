"""Evaluation over the run's processes: each scores its rows (test samples, or clients) and the
figures come back together as one process has them."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedge.data.federated import FederatedData
from fedge.distributed.cohort import Cohort, Cohorts
from fedge.engine import ClientBank, evaluate_model
from fedge.engine.evaluate import evaluation, target_count
from fedge.engine.personal import client_summary, client_test_sets, evaluate_rows
from fedge.metrics import Evaluation
from fedge.tensors import Tensors


def evaluate_model_on(
    cohorts: Cohorts, model: nn.Module, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor,
    batch_size: int,
) -> Evaluation:  # fmt: skip
    """:func:`~fedge.engine.evaluate_model` with the test rows split over the processes; correct counts
    are summed exactly (integers), losses as float64 sums, both over targets (tokens of a sequence each
    count, so a language model's per-token figures and perplexity come out as in one process). In one
    process: the plain evaluation."""
    rows = cohorts.of(len(y))
    if not rows.spread:
        return evaluate_model(model, params, buffers, x, y, batch_size)
    mine = y[rows.rows]
    part = evaluate_model(model, params, buffers, x[rows.rows], mine, batch_size)
    counts = rows.gather_array([round(part.accuracy * target_count(mine))])
    loss_sum = rows.sum_float(part.loss * target_count(mine))
    return evaluation(int(counts.sum()), loss_sum, y)


def evaluate_clients_on(
    cohort: Cohort,
    model: nn.Module,
    bank: ClientBank,
    data: FederatedData,
    max_samples: int,
    honest: np.ndarray | None = None,
) -> Evaluation:
    """The clients of ``cohort`` (of the run's clients; ``bank`` holds this process's rows of it, in client
    order) on their own test sets; every process's per-client figures gathered in client order and
    summarised as one process does. ``honest`` (boolean, one per client): summarise those clients alone
    (a run with malicious peers), every client's mean accuracy then ``accuracy_all``."""
    index, weight = client_test_sets(data)
    acc, loss = evaluate_rows(
        model, bank.params, bank.buffers, data.x_test, data.y_test, index[cohort.rows], weight[cohort.rows],
        max_samples,
    )  # fmt: skip
    gathered = cohort.gather({"accuracy": acc, "loss": loss})
    if honest is None:
        return client_summary(gathered["accuracy"], gathered["loss"])
    keep = torch.as_tensor(honest, device=gathered["accuracy"].device)
    summary = client_summary(gathered["accuracy"][keep], gathered["loss"][keep])
    return summary.with_extra(accuracy_all=float(gathered["accuracy"].double().mean()))
