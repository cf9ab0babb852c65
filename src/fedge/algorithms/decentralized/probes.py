"""Probes: cheap measurements of one client's model on another client's data, for many pairs at once.

A *pair* ``(requester i, holder k)`` evaluates the model made of i's shared parameters and k's private
parameters on one probe batch of k's training data (AFIND+ Algorithm 1, line 7: at the requester's point).
Two probes exist: the feature proxy (:mod:`~fedge.algorithms.decentralized.proxies`) and the loss
itself (:func:`pair_losses`, here, with the probe batches both draw). Pairs are gathered chunk by chunk
and evaluated in eval mode (no dropout, BatchNorm running statistics untouched).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedge.data.federated import FederatedData
from fedge.engine.personal import evaluate_rows, padded
from fedge.rng import numpy_rng
from fedge.tensors import Tensors

CHUNK_FLOATS = 2**24  # floats a chunk of pairs may gather (64 MiB at fp32)


@dataclass(frozen=True)
class ProbeBatches:
    """One probe batch per client: ``index[k]`` (padded) and ``weight[k]`` (1 real, 0 padding)."""

    index: torch.Tensor
    weight: torch.Tensor


def probe_batches(data: FederatedData, seed: int, round_: int, size: int) -> ProbeBatches:
    """``min(size, N_k)`` training samples of every client k, from the stream ``("probe", round_, k)``."""
    sets = []
    for k, ix in enumerate(data.client_train):
        take = numpy_rng(seed, "probe", round_, k).choice(len(ix), size=min(size, len(ix)), replace=False)
        sets.append(ix[np.sort(take)])
    return ProbeBatches(*padded(sets, data.device))


def gather(
    stacked: Tensors, private: set[str], shared_from: torch.Tensor, private_from: torch.Tensor
) -> Tensors:
    """Rows made of ``shared_from``'s shared tensors and ``private_from``'s private ones (copies)."""
    return {k: v[private_from if k in private else shared_from] for k, v in stacked.items()}


def pair_losses(
    model: nn.Module,
    params: Tensors,
    buffers: Tensors,
    private: set[str],
    pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    data: FederatedData,
    batches: ProbeBatches,
) -> torch.Tensor:
    """Mean cross-entropy (eval mode) of each pair's model on its data holder's probe batch.

    ``pairs = (shared_from, private_from, data_from)`` index the rows of ``params``/``buffers`` and the
    clients whose probe batch is used. Pairs are gathered in chunks (forward only).
    """
    shared_from, private_from, data_from = pairs
    per_pair = sum(v[0].numel() for v in params.values())
    chunk = max(1, CHUNK_FLOATS // max(per_pair, 1))
    out = []
    for start in range(0, len(shared_from), chunk):
        part = slice(start, start + chunk)
        s, p, d = shared_from[part], private_from[part], data_from[part]
        _, loss = evaluate_rows(
            model,
            gather(params, private, s, p),
            gather(buffers, private, s, p),
            data.x_train,
            data.y_train,
            batches.index[d],
            batches.weight[d],
        )
        out.append(loss)
    return torch.cat(out) if out else torch.zeros(0, device=data.device)
