"""The global objective the theorems talk about, over a model and federated data.

``F(theta) = (1/m) sum_i F_i(theta)`` with ``F_i`` the mean per-sample loss over client i's training samples:
equal client weights, not data-size weights (the SplitFed theory paper's Eqs. 1 and 3 weight clients by 1/m;
HIST's f, Eq. 1, is also unweighted). A :class:`FederatedObjective` evaluates per-client values and full-batch
gradients with respect to one group of parameters (for split models: the client part, the server part, ...),
the others held fixed. Models are evaluated in eval mode (dropout off, BatchNorm on its running statistics),
so the objective is a deterministic function of the parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

from fedge.data.federated import FederatedData
from fedge.rng import numpy_rng
from fedge.tensors import Tensors

LossFn = Callable[[Tensors, torch.Tensor, torch.Tensor], torch.Tensor]  # (params, x, y) -> per-sample


@contextlib.contextmanager
def eval_mode(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Switch ``modules`` to eval mode for the duration, restoring each one's mode after."""
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)


def flat(tensors: Tensors) -> torch.Tensor:
    """All tensors of a dict as one float64 vector, in the dict's order."""
    return torch.cat([t.reshape(-1).double() for t in tensors.values()])


@dataclass(frozen=True)
class FederatedObjective:
    """``F = (1/m) sum_i F_i`` of a per-sample ``loss(params, x, y)`` over the clients' samples.

    ``clients`` are index arrays into ``x`` / ``y``; ``modules`` are put in eval mode while evaluating;
    ``chunk`` caps the samples per forward pass (memory only; results do not depend on it).
    """

    loss: LossFn
    x: torch.Tensor
    y: torch.Tensor
    clients: tuple[np.ndarray, ...]
    modules: tuple[nn.Module, ...] = ()
    chunk: int = 1024

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def chunks(self, client: int, size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Client ``client``'s samples as ``(x, y)`` pieces of at most ``size`` (default ``chunk``) rows."""
        index = torch.as_tensor(self.clients[client], device=self.x.device)
        step = size or self.chunk
        for start in range(0, len(index), step):
            part = index[start : start + step]
            yield self.x[part], self.y[part]

    def client_value_and_grad(self, params: Tensors, client: int) -> tuple[float, Tensors]:
        """``F_i(params)`` and its full-batch gradient with respect to ``params``."""
        n = len(self.clients[client])
        total = 0.0
        grads = {k: torch.zeros_like(v) for k, v in params.items()}

        def chunk_sum(p: Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            value = self.loss(p, x, y).sum()
            return value, value.detach()

        with eval_mode(self.modules):
            for x, y in self.chunks(client):
                g, value = grad(chunk_sum, has_aux=True)(params, x, y)
                total += float(value)
                for k in grads:
                    grads[k] += g[k]
        return total / n, {k: g / n for k, g in grads.items()}

    def client_gradients(self, params: Tensors) -> tuple[np.ndarray, torch.Tensor]:
        """Every client's ``F_i`` value ``[m]`` and flattened float64 gradient ``[m, P]``."""
        values, rows = [], []
        for i in range(self.num_clients):
            value, g = self.client_value_and_grad(params, i)
            values.append(value)
            rows.append(flat(g))
        return np.array(values), torch.stack(rows)


def probe_indices(
    data: FederatedData, max_samples_per_client: int | None, seed: int
) -> tuple[np.ndarray, ...]:
    """Each client's training indices, or a fixed random subset of at most ``max_samples_per_client``
    of them (stream ``(seed, "theory-probe", client)``), so repeated measurements use the same samples."""
    out = []
    for c, ix in enumerate(data.client_train):
        if max_samples_per_client is not None and len(ix) > max_samples_per_client:
            keep = numpy_rng(seed, "theory-probe", c).choice(len(ix), max_samples_per_client, replace=False)
            ix = np.sort(ix[keep])
        out.append(ix)
    return tuple(out)


def model_objective(
    model: nn.Module,
    buffers: Tensors,
    data: FederatedData,
    *,
    max_samples_per_client: int | None = None,
    seed: int = 0,
) -> FederatedObjective:
    """Cross-entropy of the whole ``model`` (parameters passed at call time, ``buffers`` fixed)."""

    def loss(params: Tensors, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, {**params, **buffers}, (x,)), y, reduction="none")

    clients = probe_indices(data, max_samples_per_client, seed)
    return FederatedObjective(loss, data.x_train, data.y_train, clients, (model,))


@dataclass(frozen=True)
class SplitState:
    """A split model at one point: client trunk, auxiliary head and server part, with their parameters
    and buffers (buffers may be empty). ``aux`` is ``None`` for split learning without a local loss."""

    trunk: nn.Module
    server: nn.Module
    trunk_params: Tensors
    server_params: Tensors
    aux: nn.Module | None = None
    aux_params: Tensors | None = None
    trunk_buffers: Tensors | None = None
    server_buffers: Tensors | None = None
    aux_buffers: Tensors | None = None

    def smashed(self, trunk_params: Tensors, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.trunk, {**trunk_params, **(self.trunk_buffers or {})}, (x,))

    def server_logits(self, server_params: Tensors, z: torch.Tensor) -> torch.Tensor:
        return functional_call(self.server, {**server_params, **(self.server_buffers or {})}, (z,))

    def aux_logits(self, aux_params: Tensors, z: torch.Tensor) -> torch.Tensor:
        if self.aux is None:
            raise ValueError("this split state has no auxiliary head")
        return functional_call(self.aux, {**aux_params, **(self.aux_buffers or {})}, (z,))


def split_objectives(
    state: SplitState,
    data: FederatedData,
    *,
    max_samples_per_client: int | None = None,
    seed: int = 0,
) -> dict[str, tuple[FederatedObjective, Tensors]]:
    """The split objectives of the SplitFed theory paper (Eqs. 2-3), each with the parameters it
    differentiates:

    - ``client``: aux loss F^c w.r.t. the trunk x_C at the current averaged aux head (the theorems' G_c;
      the paper does not say which aux head);
    - ``client_joint``: aux loss w.r.t. (x_C, x_A);
    - ``server``: server loss F^s w.r.t. x_S, smashed data from the current x_C (G_s);
    - ``end_to_end``: the whole model's loss w.r.t. (x_C, x_S), which no theorem bounds.
    The ``client`` entries are omitted when the state has no aux head.
    """
    clients = probe_indices(data, max_samples_per_client, seed)
    modules = tuple(m for m in (state.trunk, state.server, state.aux) if m is not None)
    tp, sp = state.trunk_params, state.server_params

    def objective(loss: LossFn) -> FederatedObjective:
        return FederatedObjective(loss, data.x_train, data.y_train, clients, modules)

    def server_loss(p: Tensors, x, y):
        return F.cross_entropy(state.server_logits(p, state.smashed(tp, x)), y, reduction="none")

    def end_to_end(p: Tensors, x, y):
        trunk = {k[6:]: v for k, v in p.items() if k.startswith("trunk.")}
        server = {k[7:]: v for k, v in p.items() if k.startswith("server.")}
        return F.cross_entropy(state.server_logits(server, state.smashed(trunk, x)), y, reduction="none")

    joint_e2e = {**{f"trunk.{k}": v for k, v in tp.items()}, **{f"server.{k}": v for k, v in sp.items()}}
    out = {"server": (objective(server_loss), sp), "end_to_end": (objective(end_to_end), joint_e2e)}
    if state.aux is not None and state.aux_params is not None:
        ap = state.aux_params

        def client_loss(p: Tensors, x, y):
            return F.cross_entropy(state.aux_logits(ap, state.smashed(p, x)), y, reduction="none")

        def joint_loss(p: Tensors, x, y):
            trunk = {k[6:]: v for k, v in p.items() if k.startswith("trunk.")}
            aux = {k[4:]: v for k, v in p.items() if k.startswith("aux.")}
            return F.cross_entropy(state.aux_logits(aux, state.smashed(trunk, x)), y, reduction="none")

        joint = {**{f"trunk.{k}": v for k, v in tp.items()}, **{f"aux.{k}": v for k, v in ap.items()}}
        out["client"] = (objective(client_loss), tp)
        out["client_joint"] = (objective(joint_loss), joint)
    return out
