"""FederatedData: a dataset held once plus per-client index arrays, and deterministic batch plans.

Clients never copy samples: a client is a set of indices into the shared tensors. A *batch plan* lists,
for a group of clients, the sample indices of every local step, padded to a common shape
``[clients, steps, batch]`` with a 0/1 weight per entry. The sequential executor reads each client's
real rows; the batched executor gathers all clients' rows in one indexing operation per step. Both read
the same plan, so they train on the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedge.data.dataset import Dataset
from fedge.rng import numpy_rng

ClientIds = Sequence[int] | np.ndarray
"""Client indices: a sequence or a 1-D integer array."""


@dataclass(frozen=True)
class BatchPlan:
    """Sample indices of every local step of a group of clients.

    ``index[c, s, b]`` is a training-sample index; ``weight[c, s, b]`` is 1 for a real sample and 0 for
    padding (a short last batch, or steps past a client's end); ``steps[c]`` is client c's real number of
    steps. Padding entries repeat a valid index so gathers never go out of range.
    """

    clients: tuple[int, ...]
    index: torch.Tensor
    weight: torch.Tensor
    steps: torch.Tensor

    @property
    def num_steps(self) -> int:
        return int(self.index.shape[1])

    def client_batch(self, row: int, step: int) -> torch.Tensor:
        """The real sample indices of client row ``row`` at ``step`` (for the sequential executor)."""
        return self.index[row, step][self.weight[row, step] > 0]


class ResampledClients(Sequence[np.ndarray]):
    """A population of ``count`` clients whose sample indices are drawn only when a client is used.

    Client c holds ``size`` indices into a pool of ``pool`` samples (with replacement), drawn from the
    stream ``(seed, "resampled-client", c)``: the same indices every time, nothing stored per client, so a
    population of millions costs what its sampled cohort costs (cross-device federated learning).
    """

    def __init__(self, count: int, size: int, pool: int, seed: int):
        if count < 1 or size < 1 or pool < 1:
            raise ValueError("count, size and pool must be at least 1")
        self.count, self.size, self.pool, self.seed = count, size, pool, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, client: int) -> np.ndarray:  # type: ignore[override]
        client = int(client)
        if not 0 <= client < self.count:
            raise IndexError(f"client {client} out of range (population {self.count})")
        return numpy_rng(self.seed, "resampled-client", client).integers(0, self.pool, self.size)

    def sizes(self, clients: ClientIds | None = None) -> np.ndarray:
        """Every client's (or ``clients``') number of samples, without drawing them."""
        return np.full(self.count if clients is None else len(clients), self.size, dtype=np.int64)


class FederatedData:
    """Tensors on the compute device plus per-client train and test index arrays."""

    def __init__(
        self,
        dataset: Dataset,
        client_train: Sequence[np.ndarray],
        client_test: Sequence[np.ndarray],
        seed: int,
        device: torch.device | str = "cpu",
    ):
        self.dataset = dataset
        self.seed = seed
        self.device = torch.device(device)
        self.x_train = dataset.x_train.to(self.device)
        self.y_train = dataset.y_train.to(self.device)
        self.x_test = dataset.x_test.to(self.device)
        self.y_test = dataset.y_test.to(self.device)
        self.client_train = _indices(client_train)
        self.client_test = _indices(client_test)

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.dataset.input_shape

    def client_sizes(self, clients: ClientIds | None = None) -> np.ndarray:
        """Training-set size of each client (of ``clients``, or all)."""
        if isinstance(self.client_train, ResampledClients):
            return self.client_train.sizes(clients)
        chosen = range(self.num_clients) if clients is None else clients
        return np.array([len(self.client_train[c]) for c in chosen], dtype=np.int64)

    def batch_plan(
        self,
        clients: ClientIds,
        round_: int,
        epochs: int,
        batch_size: int,
        drop_last: bool = False,
        purpose: str = "batches",
    ) -> BatchPlan:
        """The local steps of ``clients`` in ``round_``: ``epochs`` passes, a fresh shuffle per epoch.

        The shuffle of client c in epoch e comes from the stream ``(seed, purpose, round_, c, e)``, so a
        client's batches do not depend on which other clients train with it.
        """
        per_client: list[np.ndarray] = []
        for client in clients:
            indices = self.client_train[client]
            batches = []
            for epoch in range(epochs):
                order = indices[
                    numpy_rng(self.seed, purpose, round_, client, epoch).permutation(len(indices))
                ]
                full = len(order) // batch_size
                usable = full * batch_size if drop_last or len(order) % batch_size == 0 else len(order)
                padded = np.full(-(-usable // batch_size) * batch_size, -1, dtype=np.int64)
                padded[:usable] = order[:usable]
                batches.append(padded.reshape(-1, batch_size))
            per_client.append(np.concatenate(batches) if batches else np.zeros((0, batch_size), np.int64))
        steps = np.array([len(b) for b in per_client], dtype=np.int64)
        grid = np.full((len(clients), max(steps.max(initial=0), 1), batch_size), -1, dtype=np.int64)
        for row, batches in enumerate(per_client):
            grid[row, : len(batches)] = batches
        weight = (grid >= 0).astype(np.float32)
        fill = np.array([self.client_train[c][0] if len(self.client_train[c]) else 0 for c in clients])
        grid = np.where(grid >= 0, grid, fill[:, None, None])
        return BatchPlan(
            clients=tuple(int(c) for c in clients),
            index=torch.from_numpy(grid).to(self.device),
            weight=torch.from_numpy(weight).to(self.device),
            steps=torch.from_numpy(steps),
        )

    def with_labels(self, y_train: torch.Tensor) -> FederatedData:
        """A view with other training labels (same samples and clients, no copy of the inputs)."""
        view = object.__new__(FederatedData)
        view.__dict__.update(self.__dict__)
        view.y_train = y_train.to(self.device)
        return view

    def pooled(self) -> FederatedData:
        """A one-client view of the union of all clients' training samples (same tensors, no copy)."""
        return self.holding(np.sort(np.concatenate(self.client_train)))

    def holding(self, indices: np.ndarray) -> FederatedData:
        """A one-client view that holds the training samples ``indices`` (same tensors, no copy): a
        server's own set, say (FLTrust's root set)."""
        view = object.__new__(FederatedData)
        view.__dict__.update(self.__dict__)
        view.client_train = [np.asarray(indices, dtype=np.int64)]
        view.client_test = [np.arange(self.dataset.num_test, dtype=np.int64)]
        return view


def _indices(clients: Sequence[np.ndarray]) -> Sequence[np.ndarray]:
    """Per-client index arrays as int64 arrays; a lazily drawn population stays lazy."""
    if isinstance(clients, ResampledClients):
        return clients
    return [np.asarray(ix, dtype=np.int64) for ix in clients]
