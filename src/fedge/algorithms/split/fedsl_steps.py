"""What a lightweight-FedSL round's steps hand on: the cut exchange's result on the clients' side, the
server's side of it, and the clients' states after their update."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

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
