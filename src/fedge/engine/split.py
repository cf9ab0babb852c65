"""Split-learning engine: per-client work over stacked state on either executor, and the pure split steps.

``Executor.train`` runs whole local epochs of one loss, which is all FedAvg needs. Split learning stops
at every batch: the client's smashed data goes to a server model, and (SplitFed) the cut-layer gradient
comes back before the client can step. So the split family drives its own step loop and needs one seam,
a :class:`ClientMap`: "apply this pure per-client function to every client's row of stacked state and
its batch". :class:`SequentialMap` loops over clients on their real rows (the reference);
:class:`BatchedMap` runs the same function under ``torch.func.vmap`` on padded rows. Both return the same
stacked outputs: state of inactive clients unchanged, per-sample outputs zero on padded rows.

The step builders here are pure functions of explicit tensors (client aux step, client forward, server
step with optional gradient clipping, applying a returned gradient), so either map can run them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vjp, vmap

from fedge.engine.bank import row
from fedge.engine.step import SGD

Tensors = dict[str, torch.Tensor]
# fn(*state, *batch, *shared) -> (state_out, per_client, per_sample), each a tuple
ClientFn = Callable[..., tuple[tuple, tuple, tuple]]


def prefixed(tensors: Tensors, prefix: str) -> Tensors:
    """The entries of ``tensors`` whose names start with ``prefix``, with the prefix removed."""
    cut = len(prefix)
    return {name[cut:]: t for name, t in tensors.items() if name.startswith(prefix)}


def weighted_cross_entropy(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the real rows (``weight`` 1) of a possibly padded batch."""
    per_sample = F.cross_entropy(logits, y, reduction="none")
    return (per_sample * weight).sum() / weight.sum().clamp_min(1.0)


def clip_global_norm(grads: Tensors, max_norm: float | None) -> Tensors:
    """Scale ``grads`` so their joint L2 norm is at most ``max_norm`` (torch's ``clip_grad_norm_`` rule)."""
    if max_norm is None:
        return grads
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())).to(next(iter(grads.values())))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {name: g * coef for name, g in grads.items()}


def _clone(tensors: Tensors) -> Tensors:
    """Fresh copies, so in-place BatchNorm statistic updates land in the copy."""
    return {name: t.clone() for name, t in tensors.items()}


class ClientMap(ABC):
    """Applies a pure per-client function to stacked state (leading client dimension) and batches.

    ``fn(*state, *inputs, *batch, *shared)`` returns ``(state_out, per_client, per_sample)``: tuples of
    the new state (one dict per entry of ``state``), of per-client values (e.g. the loss) and of
    per-sample tensors (e.g. smashed data). ``inputs`` are read-only per-client dicts, ``batch`` tensors
    are ``[clients, B, ...]``, ``shared`` values are the same for every client, and ``counts[c]`` says how
    many leading rows of client c's batch are real (0: the client is inactive at this step). Outputs are
    stacked over clients; an inactive client keeps its state and gets zeros; per-sample outputs are zero
    past ``counts``.
    """

    name: str

    @abstractmethod
    def __call__(
        self,
        fn: ClientFn,
        state: tuple,
        batch: tuple,
        shared: tuple,
        counts: torch.Tensor,
        inputs: tuple = (),
    ) -> tuple[tuple, tuple, tuple]:
        """Run ``fn`` for every client with ``counts > 0``."""

    def forward_with_vjp(
        self, fn: ClientFn, params: Tensors, buffers: Tensors, x: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, Tensors, Callable[[torch.Tensor], Tensors]]:
        """Stacked smashed data of ``fn(buffers, params, x) -> ((buffers,), (), (z,))``, the new buffers,
        and the pullback that turns cut-layer gradients ``dL/dz`` into stacked parameter gradients.

        One forward pass; the pullback reuses it (no recomputation, so dropout masks stay consistent).
        """

        def smashed(p: Tensors) -> tuple[torch.Tensor, Tensors]:
            (new_buffers,), _, (z,) = self(fn, (buffers,), (x,), (), counts, inputs=(p,))
            return z, new_buffers

        z, pullback, new_buffers = vjp(smashed, params, has_aux=True)
        return z, new_buffers, lambda grad_z: pullback(grad_z)[0]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` padded with zero rows to ``rows`` rows (differentiable)."""
    missing = rows - t.shape[0]
    return t if missing == 0 else torch.cat([t, t.new_zeros(missing, *t.shape[1:])])


class SequentialMap(ClientMap):
    """Reference: a Python loop over the active clients, each on its real rows only."""

    name = "sequential"

    def __call__(self, fn, state, batch, shared, counts, inputs=()):
        rows = [int(c) for c in counts]
        width = batch[0].shape[1] if batch else 0
        outs: list[Any] = []
        for r, count in enumerate(rows):
            if count == 0:
                outs.append(None)
                continue
            args = [row(s, r) for s in (*state, *inputs)] + [b[r, :count] for b in batch]
            outs.append(fn(*args, *shared))
        if not any(rows):
            raise ValueError("no active client: counts are all zero")
        template = next(o for o in outs if o is not None)
        new_state = tuple(
            {
                name: torch.stack(
                    [o[0][i][name] if o is not None else old[name][r] for r, o in enumerate(outs)]
                )
                for name in template[0][i]
            }
            for i, old in enumerate(state)
        )
        per_client = tuple(
            torch.stack([o[1][i] if o is not None else torch.zeros_like(v) for o in outs])
            for i, v in enumerate(template[1])
        )
        per_sample = tuple(
            torch.stack(
                [
                    _pad_rows(o[2][i], width) if o is not None else v.new_zeros(width, *v.shape[1:])
                    for o in outs
                ]
            )
            for i, v in enumerate(template[2])
        )
        return new_state, per_client, per_sample


def _keep(active: torch.Tensor, new: Tensors, old: Tensors) -> Tensors:
    """``new`` for active clients, ``old`` for the rest."""
    return {
        name: torch.where(active.reshape(-1, *([1] * (v.dim() - 1))), v, old[name]) for name, v in new.items()
    }


class BatchedMap(ClientMap):
    """All clients at once under ``vmap`` on padded rows; inactive clients and padded rows masked."""

    name = "batched"

    def __call__(self, fn, state, batch, shared, counts, inputs=()):
        in_dims = (0,) * (len(state) + len(inputs) + len(batch)) + (None,) * len(shared)
        new_state, per_client, per_sample = vmap(fn, in_dims=in_dims, randomness="different")(
            *state, *inputs, *batch, *shared
        )
        active = counts > 0
        new_state = tuple(_keep(active, new, old) for new, old in zip(new_state, state, strict=True))
        per_client = tuple(torch.where(active, v, torch.zeros_like(v)) for v in per_client)
        if per_sample:
            width = per_sample[0].shape[1]
            real = torch.arange(width, device=counts.device)[None, :] < counts[:, None]
            per_sample = tuple(
                v * real.to(v).reshape(*real.shape, *([1] * (v.dim() - 2))) for v in per_sample
            )
        return new_state, per_client, per_sample


MAPS: dict[str, type[ClientMap]] = {"sequential": SequentialMap, "batched": BatchedMap}


def client_map(executor_name: str) -> ClientMap:
    """The client map matching the run's executor (``engine.executor``)."""
    return MAPS[executor_name]()


def make_aux_step(local: nn.Module, sgd: SGD, post_step: bool) -> ClientFn:
    """One local step of a client with an auxiliary head (FSL_AN, CSE-FSL; CSE-FSL Eq. 8).

    ``local`` has children ``trunk`` (the client part) and ``aux``; state names carry those prefixes.
    The step is SGD on the aux loss over trunk and aux together and also returns the smashed data of the
    batch: by default from the forward pass of this very step (pre-update, as the authors' code does; Eq. 11's
    notation suggests post-update), or with ``post_step`` from one extra forward pass with the updated trunk.
    """
    trunk, aux = local.trunk, local.aux

    def loss(params: Tensors, buffers: Tensors, x, y, weight):
        new_buffers = _clone(buffers)
        z = functional_call(trunk, {**prefixed(params, "trunk."), **prefixed(new_buffers, "trunk.")}, (x,))
        logits = functional_call(aux, {**prefixed(params, "aux."), **prefixed(new_buffers, "aux.")}, (z,))
        return weighted_cross_entropy(logits, y, weight), (new_buffers, z)

    loss_and_grad = grad_and_value(loss, has_aux=True)

    def step(params, buffers, opt_state, x, y, weight, lr):
        grads, (value, (new_buffers, z)) = loss_and_grad(params, buffers, x, y, weight)
        new_params, new_state = sgd.update(params, grads, opt_state, lr)
        if post_step:
            scratch = _clone(prefixed(new_buffers, "trunk."))
            z = functional_call(trunk, {**prefixed(new_params, "trunk."), **scratch}, (x,))
        return (new_params, new_buffers, new_state), (value.detach(),), (z.detach(),)

    return step


def make_forward(trunk: nn.Module) -> ClientFn:
    """The client part's forward pass (state names prefixed ``trunk.``): new buffers and smashed data."""

    def forward(buffers: Tensors, params: Tensors, x):
        new_buffers = _clone(buffers)
        z = functional_call(trunk, {**prefixed(params, "trunk."), **prefixed(new_buffers, "trunk.")}, (x,))
        return (new_buffers,), (), (z,)

    return forward


def make_apply(sgd: SGD, clip_norm: float | None) -> ClientFn:
    """Apply a gradient to client parameters: clip its global norm (optional), then one SGD step."""

    def apply(params: Tensors, opt_state: Tensors, grads: Tensors, lr):
        new_params, new_state = sgd.update(params, clip_global_norm(grads, clip_norm), opt_state, lr)
        return (new_params, new_state), (), ()

    return apply


def make_server_step(
    server: nn.Module, sgd: SGD, clip_norm: float | None, grad_z: bool, vmappable: bool = True
) -> ClientFn:
    """One server SGD step on a batch of smashed data (CSE-FSL Eq. 11 / SplitFed's server update).

    Returns the new server state, the loss, and with ``grad_z`` the cut-layer gradient ``dL/dz`` of the
    batch's mean loss (what SplitFed sends back), taken at the pre-update server parameters. The server
    gradient's global norm is clipped at ``clip_norm`` when set (FSL_OC; CSE-FSL Sec. VI-A gives no
    threshold). Server copies run under a :class:`ClientMap` and need the ``torch.func`` version
    (``vmappable``); a shared server model steps one batch at a time, where plain autograd computes the
    same gradients with half the per-call overhead.
    """

    def loss(params: Tensors, z, buffers: Tensors, y, weight):
        new_buffers = _clone(buffers)
        logits = functional_call(server, {**params, **new_buffers}, (z,))
        return weighted_cross_entropy(logits, y, weight), new_buffers

    if vmappable:
        loss_and_grad = grad_and_value(loss, argnums=(0, 1) if grad_z else 0, has_aux=True)
    else:

        def loss_and_grad(params, z, buffers, y, weight):
            leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
            inputs = [*leaves.values()]
            if grad_z:
                z = z.detach().requires_grad_(True)
                inputs.append(z)
            with torch.enable_grad():
                value, new_buffers = loss(leaves, z, buffers, y, weight)
                grads = torch.autograd.grad(value, inputs)
            param_grads = dict(zip(leaves, grads[: len(leaves)], strict=True))
            return ((param_grads, grads[-1]) if grad_z else param_grads), (value, new_buffers)

    def step(params, buffers, opt_state, z, y, weight, lr):
        grads, (value, new_buffers) = loss_and_grad(params, z, buffers, y, weight)
        param_grads, z_grad = grads if grad_z else (grads, None)
        new_params, new_state = sgd.update(params, clip_global_norm(param_grads, clip_norm), opt_state, lr)
        return (new_params, new_buffers, new_state), (value.detach(),), ((z_grad,) if grad_z else ())

    return step
