"""ClientBank: the state of a group of clients as stacked tensors, one leading row per client.

A client is a row, not an object: parameters, buffers (BatchNorm statistics) and optimizer state of
all clients live in one tensor per name, so memory grows with the clients that hold state and local
training of the whole group can run as one vectorised computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Tensors = dict[str, torch.Tensor]


def stack_copies(tensors: Tensors, count: int) -> Tensors:
    """``count`` independent copies of every tensor, stacked along a new leading dimension."""
    return {name: t.unsqueeze(0).repeat(count, *([1] * t.dim())) for name, t in tensors.items()}


def row(tensors: Tensors, index: int) -> Tensors:
    """One client's slice of stacked tensors."""
    return {name: t[index] for name, t in tensors.items()}


def weighted_sum(stacked: Tensors, weights: torch.Tensor) -> Tensors:
    """``sum_c weights[c] * stacked[c]`` for floating tensors; integer tensors (counters) take the max."""
    out = {}
    for name, t in stacked.items():
        if t.is_floating_point():
            w = weights.to(t.dtype).reshape(-1, *([1] * (t.dim() - 1)))
            out[name] = (w * t).sum(dim=0)
        else:
            out[name] = t.max(dim=0).values
    return out


@dataclass
class ClientBank:
    """Stacked parameters, buffers and optimizer state of the clients in ``clients`` (row order)."""

    clients: tuple[int, ...]
    params: Tensors
    buffers: Tensors = field(default_factory=dict)
    opt_state: Tensors = field(default_factory=dict)

    @classmethod
    def broadcast(
        cls, clients: Sequence[int], params: Tensors, buffers: Tensors, opt_state: Tensors | None = None
    ) -> ClientBank:
        """Every client in ``clients`` starts from the same (global) state."""
        n = len(clients)
        return cls(
            clients=tuple(int(c) for c in clients),
            params=stack_copies(params, n),
            buffers=stack_copies(buffers, n),
            opt_state=stack_copies(opt_state or {}, n),
        )

    def __len__(self) -> int:
        return len(self.clients)

    def client(self, index: int) -> tuple[Tensors, Tensors]:
        """Parameters and buffers of the client in row ``index``."""
        return row(self.params, index), row(self.buffers, index)

    def average(self, weights: torch.Tensor) -> tuple[Tensors, Tensors]:
        """Weighted average of parameters and buffers over the clients (weights sum to 1)."""
        return weighted_sum(self.params, weights), weighted_sum(self.buffers, weights)
