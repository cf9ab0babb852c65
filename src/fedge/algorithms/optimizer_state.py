"""Clients' optimizer state across rounds (momentum buffers, Adam's moments and step count), for the
algorithms whose clients restart from a broadcast model each round (FedAvg, the split family).

``reset`` (the default) starts every participant from a fresh state each round; ``keep`` stores each
client's state when its round ends and gives it back the next time the client participates (a first
visit starts fresh), as the FSL-SAGE peer implementation does. A client drawn several times in one round
keeps the mean of its rows' states (as it keeps the mean of unshared aux heads). On several processes the
states are gathered, so every process keeps every client's. The kept states are part of the algorithm's
checkpoint, so a resumed run continues exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.distributed import Cohort
from fedge.engine import ClientBank, Optimizer, stack_copies
from fedge.tensors import Tensors


class ClientOptimizerStates:
    """Every round's stacked client optimizer state: fresh (``keep`` False) or each client's own."""

    def __init__(self, optimizer: Optimizer, keep: bool):
        self.optimizer, self.keep = optimizer, keep
        self.kept: dict[int, Tensors] = {}

    def start(self, clients: tuple[int, ...] | np.ndarray, params: Tensors) -> Tensors:
        """The stacked state of the rows of ``clients`` (this process's) for a round from ``params``."""
        fresh = self.optimizer.init(params)
        if not self.keep:
            return stack_copies(fresh, len(clients))
        own = [self.kept.get(int(c), fresh) for c in clients]
        return {name: torch.stack([state[name] for state in own]) for name in fresh}

    def bank(self, clients: np.ndarray, params: Tensors, buffers: Tensors) -> ClientBank:
        """A bank of ``clients`` (this process's rows) starting from the broadcast ``params`` and
        ``buffers``, each with its optimizer state for the round (fresh tensors: the bank owns them)."""
        if self.keep:
            bank = ClientBank.broadcast(clients, params, buffers)
            bank.opt_state = self.start(clients, params)
            return bank
        return ClientBank.broadcast(clients, params, buffers, self.optimizer.init(params))

    def end(self, clients: np.ndarray, own: Tensors, cohort: Cohort) -> None:
        """With ``keep``: store the state each of the round's ``clients`` (every row, in row order) ends
        with; ``own`` is this process's rows' stacked state."""
        if self.keep and own:
            self.kept.update(cohort.client_means(clients, own))

    def state_dict(self) -> dict[int, Tensors]:
        """The kept states, for checkpoints (an algorithm saves them only under ``keep``)."""
        return self.kept

    def load_state_dict(self, state: dict[int, Tensors]) -> None:
        """Hold the kept states of :meth:`state_dict`."""
        self.kept = {int(client): dict(tensors) for client, tensors in state.items()}
