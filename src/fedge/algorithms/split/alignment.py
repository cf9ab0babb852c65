"""FSL-SAGE's alignment: the server fits each client's auxiliary model to the server's own cut-layer
gradients on that client's smashed data.

The server keeps, per client, the last ``capacity`` smashed samples it received from it and their labels
(:class:`AlignmentStore`). At an alignment it recomputes, with its current model, the true per-sample
gradient ``g_n = d loss(server(z_n), y_n) / d z_n`` of every stored sample, and then takes ``epochs``
passes of optimizer steps over the store in shuffled batches on the gradient-matching loss

    mean over the batch of || d loss(aux(z_n), y_n) / d z_n  -  g_n ||^2

in the aux model's weights (a second-order autograd pass: the aux model's input gradient is a function of
its weights). This is the paper's alignment objective (the aux model's estimated smashed-activation
gradient against the server's), :class:`Aligner`. The public code's form of it (``mean_loss_gradients``)
compares gradients of mean losses instead: the aux model's input gradient of its batch's mean loss
(``ghat_n / B`` for a batch of B) against the stored gradients of the whole store's mean loss
(``g_n / N`` for a store of N), summed over the batch,

    sum over the batch of || ghat_n / B  -  g_n / N ||^2,

which is ``1 / N^2`` times the sum of ``|| ghat_n - g_n ||^2``, so 1/N times the per-sample mean above,
when a batch is the whole store (the code's default); with smaller batches its two sides carry different
scales. Adam undoes a constant factor only where its gradients are large against its eps, and the code's
form makes them about N times smaller: the aligned models differ (docs/decisions.md, "FSL-SAGE", gives
the measured difference). The aux model's optimizer state is the server's, kept per client across
alignments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedge.comm import state_bits
from fedge.engine import Optimizer
from fedge.engine.bind import call_at
from fedge.engine.noise import has_random_layers, keyed_noise
from fedge.engine.split import prefixed
from fedge.engine.step import Criterion
from fedge.tensors import Tensors

AlignmentLoss = Literal["per_sample_mean", "mean_loss_gradients"]


class AlignmentStore:
    """Per client: the last ``capacity`` smashed samples the server received (``z``), their labels (``y``)
    and the client's aux-optimizer state (``opt.*``), as plain tensors (a resumable state)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.data: dict[int, Tensors] = {}

    def add(self, client: int, z: torch.Tensor, y: torch.Tensor) -> None:
        """Append a batch of client ``client``'s smashed data and labels; the oldest samples go first."""
        entry = self.data.setdefault(client, {})
        if "z" in entry:
            z, y = torch.cat([entry["z"], z]), torch.cat([entry["y"], y])
        entry["z"], entry["y"] = z[-self.capacity :].clone(), y[-self.capacity :].clone()

    def samples(self, client: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Client ``client``'s stored smashed data and labels (None before its first upload)."""
        entry = self.data.get(client)
        return None if entry is None else (entry["z"], entry["y"])

    def optimizer_state(self, client: int) -> Tensors | None:
        """The server's optimizer state of client ``client``'s aux model (None before its first alignment)."""
        entry = self.data.get(client, {})
        state = prefixed(entry, "opt.")
        return state if any(name.startswith("opt.") for name in entry) else None

    def keep_optimizer_state(self, client: int, state: Tensors) -> None:
        entry = self.data[client]
        for name in [name for name in entry if name.startswith("opt.")]:
            del entry[name]
        entry.update({f"opt.{name}": t for name, t in state.items()})

    def bits(self) -> int:
        """Bits the server holds for alignment: every client's smashed samples (labels as fp32 values)."""
        return sum(state_bits({"z": e["z"]}) + 32 * e["y"].numel() for e in self.data.values())

    def state_dict(self) -> dict[str, Any]:
        return {"data": self.data}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data = {int(client): dict(entry) for client, entry in state["data"].items()}


@dataclass(frozen=True)
class Aligned:
    """An aligned aux model, its optimizer state, and the gradient-matching loss before and after."""

    params: Tensors
    opt_state: Tensors
    loss_before: float
    loss_after: float


class Aligner:
    """Fits aux models (``aux``, names ``aux.*``) to the server part's (``server``) cut-layer gradients."""

    def __init__(
        self,
        server: nn.Module,
        aux: nn.Module,
        criterion: Criterion,
        optimizer: Optimizer,
        lr: float,
        epochs: int,
        batch_size: int,
        loss: AlignmentLoss = "per_sample_mean",
    ):
        self.server, self.aux, self.criterion, self.optimizer = server, aux, criterion, optimizer
        self.lr, self.epochs, self.batch_size, self.loss = lr, epochs, batch_size, loss
        self.random_server = has_random_layers(server)

    def true_gradients(
        self, params: Tensors, buffers: Tensors, z: torch.Tensor, y: torch.Tensor, key: int
    ) -> torch.Tensor:
        """The server's per-sample cut-layer gradients of ``z`` at its weights ``params`` (the server's
        buffers are left as they are; its random layers draw from ``key``)."""
        leaf = z.detach().requires_grad_(True)
        noise = torch.tensor(key, dtype=torch.int64, device=z.device) if self.random_server else None
        scratch = {name: t.clone() for name, t in buffers.items()}
        with torch.enable_grad(), keyed_noise(noise):
            losses = self.criterion(call_at(self.server, {**params, **scratch}, (leaf,)), y)
            (grad,) = torch.autograd.grad(losses.sum(), leaf)
        return grad.detach()

    def _estimates(self, params: Tensors, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The aux model's per-sample estimated cut-layer gradients, differentiable in ``params``."""
        leaf = z.detach().requires_grad_(True)
        losses = self.criterion(call_at(self.aux, prefixed(params, "aux."), (leaf,)), y)
        (grad,) = torch.autograd.grad(losses.sum(), leaf, create_graph=True)
        return grad

    def mismatch(
        self, params: Tensors, z: torch.Tensor, y: torch.Tensor, g: torch.Tensor, stored: int | None = None
    ) -> torch.Tensor:
        """The gradient-matching loss of aux weights ``params`` on samples ``z``, ``y`` with true per-sample
        gradients ``g``, drawn from a store of ``stored`` samples (default: the samples are the store):
        ``per_sample_mean``, the mean over samples of the squared distance between estimate and truth, or
        ``mean_loss_gradients``, the code's sum of squared differences between the gradients of the
        batch's and the store's mean losses."""
        estimates = self._estimates(params, z, y)
        if self.loss == "mean_loss_gradients":
            return (estimates / len(y) - g / (stored or len(y))).pow(2).sum()
        return (estimates - g).flatten(1).pow(2).sum(dim=1).mean()

    def align(
        self,
        params: Tensors,
        opt_state: Tensors | None,
        samples: tuple[torch.Tensor, torch.Tensor],
        g: torch.Tensor,
        rng: np.random.Generator,
    ) -> Aligned:
        """``epochs`` passes over ``samples`` in batches drawn by ``rng``, from aux weights ``params``."""
        z, y = samples
        params = {name: t.detach() for name, t in params.items()}
        state = self.optimizer.init(params) if opt_state is None else opt_state
        with torch.enable_grad():
            before = float(self.mismatch(self._leaves(params), z, y, g).detach())
            for _ in range(self.epochs):
                order = torch.as_tensor(rng.permutation(len(y)), device=z.device)
                for batch in order.split(self.batch_size):
                    leaves = self._leaves(params)
                    loss = self.mismatch(leaves, z[batch], y[batch], g[batch], len(y))
                    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())), strict=True))
                    params, state = self.optimizer.update(params, grads, state, self.lr)
                    params = {name: t.detach() for name, t in params.items()}
            after = float(self.mismatch(self._leaves(params), z, y, g).detach())
        return Aligned(params, {name: t.detach() for name, t in state.items()}, before, after)

    @staticmethod
    def _leaves(params: Tensors) -> Tensors:
        return {name: t.detach().requires_grad_(True) for name, t in params.items()}
