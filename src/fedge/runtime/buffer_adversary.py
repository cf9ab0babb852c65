"""Malicious clients of an asynchronous server (FedBuff, FedAsync): the updates they add to its buffer.

The run's :class:`~fedge.runtime.adversary.Adversary` names the malicious clients and the attack; a
malicious client attacks with every update that the server merges in a round from ``start_round`` on
(``label_flip``: every job dispatched from that round on). An asynchronous client's update is its change
``d = x - x_v`` from the model version ``x_v`` it trained from, so the attacks act on the deltas with
that version as each one's reference (:func:`~fedge.runtime.adversary.poisoned` over the deltas, with a
zero reference), and the poisoned model the server sees is ``x_v + d'``. The buffer is the round's set
of rows: ``alie`` and ``ipm`` read the honest deltas in the buffer when it is flushed (what the server
merges with them; Baruch et al. 2019 and Xie et al. 2020 assume an attacker that sees the aggregator's
rows), and ``scaling``'s default ``n / m`` is the buffer's updates over its malicious ones. FedAsync
merges one update at a time, so there are no honest rows to read: ``alie`` and ``ipm`` are refused there.
``gaussian`` draws from ``(seed, "adversary-gaussian", round, client)``: a client is in a buffer once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedge.runtime.adversary import Adversary
from fedge.tensors import Tensors


def poisoned_updates(
    adversary: Adversary, round_: int, clients: np.ndarray, models: list[Tensors], bases: list[Tensors]
) -> list[Tensors]:
    """``models`` (the uploaded models of ``clients``, in buffer order, each trained from ``bases[i]``)
    with the attacking clients' replaced by ``base + d'`` (see the module); the honest ones as they are."""
    bad = adversary.mask(round_, clients)
    if not bad.any():
        return models
    deltas = {k: torch.stack([m[k] - b[k] for m, b in zip(models, bases, strict=True)]) for k in models[0]}
    zero = {k: torch.zeros_like(v[0]) for k, v in deltas.items()}
    replaced = adversary.poison(round_, clients, deltas, zero)
    return [
        {k: bases[i][k] + replaced[k][i] for k in model} if bad[i] else model
        for i, model in enumerate(models)
    ]


def combined(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """Several merges' adversary figures as one round's: ``malicious`` summed, ``malicious_kept`` their
    mean (left out where some merge did not report it)."""
    if not figures:
        return {}
    out: dict[str, Any] = {"malicious": sum(int(f["malicious"]) for f in figures)}
    if all("malicious_kept" in f for f in figures):
        out["malicious_kept"] = float(np.mean([f["malicious_kept"] for f in figures]))
    return out
