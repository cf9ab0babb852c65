"""Lightweight FedSL's steps (a round is one step): each client's mini-batch of the round, and what the
round's steps hand on: the cut exchange's result on the clients' side, the server's side of it, and the
clients' states after their update."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from fedge.data.federated import BatchPlan, FederatedData
from fedge.errors import ConfigError
from fedge.tensors import Tensors


class CutStep(NamedTuple):
    """This process's clients after the cut exchange of a round: their parameters, new BatchNorm
    statistics and parameter gradients, every client's loss, and the bits each client sent and got."""

    params: Tensors
    buffers: Tensors
    grads: Tensors
    loss: torch.Tensor
    up_bits: np.ndarray
    down_bits: np.ndarray


class ServedCut(NamedTuple):
    """The server's side of a cut exchange: the gradient each client receives (kept entries), every
    client's loss, and the bits each client sent and got."""

    grad: torch.Tensor
    loss: torch.Tensor
    up_bits: np.ndarray
    down_bits: np.ndarray


class Trained(NamedTuple):
    """This process's clients after a round's step: their ``params``, ``buffers`` and ``masks``, every
    client's loss, and the bits each client sent and got at the cut."""

    states: dict[str, Tensors]
    loss: torch.Tensor
    up_bits: np.ndarray
    down_bits: np.ndarray


class StepBatches:
    """Each client's next mini-batch, one per round: its samples in epochs, a fresh shuffle per epoch.

    Client k's epoch e is the shuffle of the stream ``(seed, "batches", e + 1, k, 0)`` (FedAvg's round
    e + 1 batches), cut into ``batch_size`` batches; round t takes batch ``(t - 1) mod steps_k`` of epoch
    ``(t - 1) div steps_k``. Derived from the seed alone, so resumed runs see the same batches.
    """

    def __init__(self, data: FederatedData, batch_size: int, drop_last: bool):
        sizes = data.client_sizes()
        self.steps = sizes // batch_size if drop_last else -(-sizes // batch_size)
        if not self.steps.all():
            smallest = int(sizes.min())
            raise ConfigError(
                "algorithm.batch_size",
                f"{batch_size} exceeds the smallest client ({smallest} samples) with drop_last",
            )
        self.data, self.batch_size, self.drop_last = data, batch_size, drop_last
        self._epochs: dict[int, tuple[int, BatchPlan]] = {}

    def __call__(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample indices ``[K, batch]`` and 0/1 weights (0 pads a short last batch) of round ``t``."""
        index, weight = [], []
        for k, steps in enumerate(self.steps.tolist()):
            epoch, position = divmod(t - 1, steps)
            cached = self._epochs.get(k)
            if cached is None or cached[0] != epoch:
                plan = self.data.batch_plan([k], epoch + 1, 1, self.batch_size, self.drop_last)
                cached = self._epochs[k] = (epoch, plan)
            index.append(cached[1].index[0, position])
            weight.append(cached[1].weight[0, position])
        return torch.stack(index), torch.stack(weight)

    def epoch_samples(self, t: int) -> np.ndarray:
        """The samples of the epoch each client opens in round ``t`` (after :meth:`__call__` of ``t``),
        ``[K, ...]`` padded with -1, none for a client in the middle of an epoch: an epoch's rounds send
        each of them once, a release the privacy ledger records at the epoch's first round."""
        opened = []
        for k, steps in enumerate(self.steps.tolist()):
            plan = self._epochs[k][1]
            picked = torch.where(plan.weight[0] > 0, plan.index[0], -1).flatten()
            opened.append(picked.cpu().numpy() if (t - 1) % steps == 0 else np.zeros(0, dtype=np.int64))
        out = np.full((len(opened), max(len(o) for o in opened)), -1, dtype=np.int64)
        for k, samples in enumerate(opened):
            out[k, : len(samples)] = samples
        return out
