"""ClientBank: the state of a group of clients as stacked tensors, one leading row per client.

A client is a row, not an object: parameters, buffers (BatchNorm statistics) and optimizer state of
all clients live in one tensor per name, so memory grows with the clients that hold state and local
training of the whole group can run as one vectorised computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedge.tensors import Tensors, rows


def stack_copies(tensors: Tensors, count: int) -> Tensors:
    """``count`` independent copies of every tensor, stacked along a new leading dimension."""
    return {name: t.unsqueeze(0).repeat(count, *([1] * t.dim())) for name, t in tensors.items()}


def weighted_sum(stacked: Tensors, weights: torch.Tensor) -> Tensors:
    """``sum_c weights[c] * stacked[c]`` for floating tensors; integer tensors (counters) take the max.

    A matrix-vector product over the flattened rows, so no temporary as large as the stacked state.
    """
    out = {}
    for name, t in stacked.items():
        if t.is_floating_point():
            out[name] = (weights.to(t.dtype) @ t.reshape(t.shape[0], -1)).reshape(t.shape[1:])
        else:
            out[name] = t.max(dim=0).values
    return out


@dataclass
class ClientBank:
    """Stacked parameters, buffers and optimizer state of the clients in ``clients`` (row order).

    ``owned`` says the bank's tensors were made for it and nothing else refers to them (as
    :meth:`broadcast` makes them): executors then train them in place. Otherwise an executor leaves
    the tensors it was given untouched and gives the bank new ones, so a bank built from tensors that
    are also held elsewhere (another bank's rows, a model's state) never changes them behind the
    holder's back. In-place training saves a second copy of the whole stacked state, which is most of
    the memory of a round with many clients. Whoever gives a bank new tensors says whether it owns them
    (:meth:`adopt`).
    """

    clients: tuple[int, ...]
    params: Tensors
    buffers: Tensors = field(default_factory=dict)
    opt_state: Tensors = field(default_factory=dict)
    owned: bool = False

    @classmethod
    def broadcast(
        cls,
        clients: Sequence[int] | np.ndarray,
        params: Tensors,
        buffers: Tensors,
        opt_state: Tensors | None = None,
    ) -> ClientBank:
        """Every client in ``clients`` starts from the same (global) state, in fresh tensors it owns."""
        n = len(clients)
        return cls(
            clients=tuple(int(c) for c in clients),
            params=stack_copies(params, n),
            buffers=stack_copies(buffers, n),
            opt_state=stack_copies(opt_state or {}, n),
            owned=True,
        )

    def adopt(
        self,
        params: Tensors,
        buffers: Tensors | None = None,
        opt_state: Tensors | None = None,
        *,
        owned: bool,
    ) -> None:
        """Hold new tensors (buffers and optimizer state kept when not given); ``owned`` says whether
        nothing else refers to them, so that executors may train them in place."""
        self.params = params
        self.buffers = self.buffers if buffers is None else buffers
        self.opt_state = self.opt_state if opt_state is None else opt_state
        self.owned = owned

    def state_dict(self) -> dict[str, Tensors]:
        """The stacked state, for checkpoints."""
        return {"params": self.params, "buffers": self.buffers, "opt_state": self.opt_state}

    def load_state_dict(self, state: dict[str, Tensors]) -> None:
        """Hold the state of :meth:`state_dict` (fresh tensors from a checkpoint: owned)."""
        self.adopt(state["params"], state["buffers"], state["opt_state"], owned=True)

    def __len__(self) -> int:
        return len(self.clients)

    def client(self, index: int) -> tuple[Tensors, Tensors]:
        """Parameters and buffers of the client in row ``index``."""
        return rows(self.params, index), rows(self.buffers, index)

    def state_bytes(self) -> int:
        """Bytes held by the stacked parameters, buffers and optimizer state."""
        tensors = [*self.params.values(), *self.buffers.values(), *self.opt_state.values()]
        return sum(t.numel() * t.element_size() for t in tensors)
