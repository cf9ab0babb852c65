"""Personalised evaluation of a stacked bank: every row's own model on its own samples, in one vmap.

Personalised FL measures each client's model on that client's test set and reports the unweighted mean
over clients. With the clients' models stacked (a :class:`~fedge.engine.ClientBank`), the per-row sample
sets are padded to a common length with 0/1 weights and all rows are evaluated together under
``torch.func.vmap`` (in chunks bounded by a sample budget; convolutions one per client, the faster
kernel on CPU, see :mod:`fedge.engine.convolution`). The same routine scores any row on any
client's samples (a neighbour's model on my data), which is what peer-selection rules need.
Fine-tuning before evaluation (FedAvg-FT, the backbone of the decentralized family) trains a copy of the
bank through the run's executor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from fedge.data.federated import FederatedData
from fedge.engine.bank import ClientBank
from fedge.engine.bind import call_at
from fedge.engine.executors import Executor
from fedge.engine.kernels import batched_kernels
from fedge.engine.step import StepFn
from fedge.metrics import Evaluation
from fedge.tensors import Tensors


def padded(
    index_sets: Sequence[np.ndarray], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index sets of unequal length as ``[R, L]`` indices and 0/1 weights (padding repeats a real index)."""
    length = max(1, max((len(ix) for ix in index_sets), default=1))
    index = np.zeros((len(index_sets), length), dtype=np.int64)
    weight = np.zeros((len(index_sets), length), dtype=np.float32)
    for r, ix in enumerate(index_sets):
        index[r, : len(ix)] = ix
        index[r, len(ix) :] = ix[0] if len(ix) else 0
        weight[r, : len(ix)] = 1.0
    return torch.from_numpy(index).to(device), torch.from_numpy(weight).to(device)


@torch.no_grad()
def evaluate_rows(
    model: nn.Module,
    params: Tensors,
    buffers: Tensors,
    x: torch.Tensor,
    y: torch.Tensor,
    index: torch.Tensor,
    weight: torch.Tensor,
    max_samples: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accuracy and mean cross-entropy of row ``r``'s model on samples ``index[r]`` (eval mode), per row.

    ``params``/``buffers`` are stacked with one row per entry of ``index``. Rows are evaluated in chunks
    of at most ``max_samples`` samples; a row without real samples gets accuracy and loss 0.
    """
    rows, length = index.shape

    def one(p: Tensors, b: Tensors, xb: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor):
        logits = call_at(model, {**p, **b}, (xb,))
        loss = F.cross_entropy(logits, yb, reduction="none")
        correct = (logits.argmax(dim=1) == yb).to(loss.dtype)
        return (correct * wb).sum(), (loss * wb).sum()

    batched = vmap(one)
    chunk = max(1, max_samples // length)
    correct, loss = [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            ix = index[part]
            with batched_kernels():
                c, s = batched(
                    {k: v[part] for k, v in params.items()},
                    {k: v[part] for k, v in buffers.items()},
                    x[ix],
                    y[ix],
                    weight[part],
                )
            correct.append(c)
            loss.append(s)
    finally:
        model.train(was_training)
    count = weight.sum(dim=1).clamp_min(1.0)
    return torch.cat(correct) / count, torch.cat(loss) / count


def client_test_sets(data: FederatedData) -> tuple[torch.Tensor, torch.Tensor]:
    """Every client's test set (``data.client_test``) as padded ``[n, L]`` indices and weights."""
    return padded(data.client_test, data.device)


def evaluate_clients(
    model: nn.Module, bank: ClientBank, data: FederatedData, max_samples: int = 2048
) -> Evaluation:
    """Each client's model on its own test set: mean, std, min over clients of accuracy, mean loss.

    ``bank`` must hold one row per client, in client order. The mean is unweighted over clients, the
    personalised-FL convention (as AFIND+ reports its Tables 1-4).
    """
    index, weight = client_test_sets(data)
    acc, loss = evaluate_rows(
        model, bank.params, bank.buffers, data.x_test, data.y_test, index, weight, max_samples
    )
    return client_summary(acc, loss)


def client_summary(acc: torch.Tensor, loss: torch.Tensor) -> Evaluation:
    """The evaluation of per-client accuracies and losses: their means, the accuracies' spread and minimum."""
    acc = acc.double()
    return Evaluation(
        float(acc.mean()),
        float(loss.double().mean()),
        {"accuracy_std": float(acc.std(unbiased=False)), "accuracy_min": float(acc.min())},
    )


def fine_tuned(
    executor: Executor,
    step: StepFn,
    bank: ClientBank,
    opt_state: Tensors,
    data: FederatedData,
    round_: int,
    epochs: int,
    batch_size: int,
    lr: float,
    drop_last: bool = False,
) -> ClientBank:
    """A copy of ``bank`` after ``epochs`` epochs of local training of every row on its own client's data.

    Batches come from the ``"finetune"`` stream of ``round_``, so fine-tuning never changes the batches
    of the training rounds; ``opt_state`` is the fresh optimizer state of every row. ``bank`` is untouched.
    """
    copy = ClientBank(
        clients=bank.clients,
        params={k: v.clone() for k, v in bank.params.items()},
        buffers={k: v.clone() for k, v in bank.buffers.items()},
        opt_state=opt_state,
    )
    if epochs > 0:
        plan = data.batch_plan(bank.clients, round_, epochs, batch_size, drop_last, purpose="finetune")
        executor.train(step, copy, plan, data, lr)
    return copy
