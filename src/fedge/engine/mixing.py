"""Mixing: one round of peer-to-peer averaging as one matrix product over stacked client state.

Decentralized algorithms set each client's next model to a weighted combination of models it received.
With all models stacked along a leading row dimension, a round's mixing for every client at once is
``W @ X`` per tensor, where ``W[i, r]`` is the weight client ``i`` gives row ``r`` (rows may be the
clients themselves, ``W`` then being ``[n, n]``, or any set of trained copies, ``[n, R]``). No loop over
pairs; the same operation on either executor's bank.
"""

from __future__ import annotations

import torch

from fedge.tensors import Tensors


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


def mix(stacked: Tensors, weights: torch.Tensor) -> Tensors:
    """``weights @ stacked`` for every floating tensor: ``out[i] = sum_r weights[i, r] * stacked[name][r]``.

    ``weights`` is ``[n_out, R]`` over the ``R`` stacked rows. Integer tensors (counters such as
    BatchNorm's ``num_batches_tracked``) cannot be averaged and are left out of the result.
    """
    out = {}
    for name, t in stacked.items():
        if not t.is_floating_point():
            continue
        w = weights.to(device=t.device, dtype=t.dtype)
        out[name] = (w @ _flat(t)).reshape(w.shape[0], *t.shape[1:])
    return out


def uniform_rows(selected: torch.Tensor, include_self: bool = True) -> torch.Tensor:
    """Row-stochastic ``[n, n]`` weights: client ``i`` averages uniformly over ``selected[i]`` (and itself).

    ``selected`` is a boolean ``[n, n]`` matrix of chosen peers. A client that chose nobody keeps its own
    model (weight 1 on itself) whatever ``include_self`` says.
    """
    chosen = selected.clone()
    n = chosen.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=chosen.device)
    empty = ~chosen.any(dim=1, keepdim=True)
    chosen = chosen | (eye & (empty | include_self))
    weights = chosen.to(torch.float64)
    return weights / weights.sum(dim=1, keepdim=True)
