"""The pure steps of split learning, for :meth:`fedge.engine.Executor.map`.

``Executor.train`` runs whole local epochs of one loss, which is all FedAvg needs. Split learning stops
at every batch: the client's smashed data goes to a server model, and (SplitFed) the cut-layer gradient
comes back before the client can step. So the split family drives its own step loop through
``Executor.map`` with the functions built here: a client's aux-head step, the client part's forward
pass, applying a returned gradient, NoPeek's term at the cut (:func:`make_nopeek_gradient`; the aux-head
step takes it as a penalty) and a server step with optional gradient clipping. Each is a pure function
of one client's explicit tensors returning a :class:`~fedge.engine.executors.Mapped`, so either executor
runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import grad, grad_and_value

from fedge.engine.bind import call_at
from fedge.engine.distance_correlation import distance_correlation
from fedge.engine.executors import ClientFn, Mapped, TwoForms
from fedge.engine.folded import folded_forward, folds_clients
from fedge.engine.step import (
    Criterion,
    Optimizer,
    cross_entropy,
    grad_leaves,
    leaf_gradients,
    weighted_mean,
)
from fedge.privacy.cut import clip_rows
from fedge.tensors import Tensors


def prefixed(tensors: Tensors, prefix: str) -> Tensors:
    """The entries of ``tensors`` whose names start with ``prefix``, with the prefix removed."""
    cut = len(prefix)
    return {name[cut:]: t for name, t in tensors.items() if name.startswith(prefix)}


def weighted_loss(
    logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, criterion: Criterion = cross_entropy
) -> torch.Tensor:
    """Mean of ``criterion`` (cross-entropy by default) over the real rows (``weight`` 1) of a batch."""
    return weighted_mean(criterion(logits, y), weight)


def clip_global_norm(grads: Tensors, max_norm: float | None) -> Tensors:
    """Scale ``grads`` so their joint L2 norm is at most ``max_norm`` (torch's ``clip_grad_norm_`` rule)."""
    if max_norm is None:
        return grads
    squares = [(g.double() ** 2).sum() for g in grads.values()]
    total = torch.sqrt(functools.reduce(torch.add, squares)).to(next(iter(grads.values())))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {name: g * coef for name, g in grads.items()}


def _clone(tensors: Tensors) -> Tensors:
    """Fresh copies, so in-place BatchNorm statistic updates land in the copy."""
    return {name: t.clone() for name, t in tensors.items()}


Penalty = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(x, z, weight)`` -> a term added to a client's loss on its inputs and smashed data (NoPeek's)."""


def make_aux_step(
    local: nn.Module,
    sgd: Optimizer,
    post_step: bool,
    criterion: Criterion = cross_entropy,
    penalty: Penalty | None = None,
) -> ClientFn:
    """One local step of a client with an auxiliary head (FSL_AN, CSE-FSL; CSE-FSL Eq. 8).

    ``local`` has children ``trunk`` (the client part) and ``aux``; state names carry those prefixes.
    The step is SGD on the aux loss over trunk and aux together and also returns the smashed data of the
    batch: by default from the forward pass of this very step (pre-update, as the authors' code does; Eq. 11's
    notation suggests post-update), or with ``post_step`` from one extra forward pass with the updated trunk.
    With a ``penalty`` the step descends the aux loss plus the penalty of the batch and its smashed data;
    the loss it reports is the aux loss alone.
    """
    trunk, aux = local.get_submodule("trunk"), local.get_submodule("aux")

    def loss(params: Tensors, buffers: Tensors, x, y, weight):
        new_buffers = _clone(buffers)
        z = call_at(trunk, {**prefixed(params, "trunk."), **prefixed(new_buffers, "trunk.")}, (x,))
        logits = call_at(aux, {**prefixed(params, "aux."), **prefixed(new_buffers, "aux.")}, (z,))
        task = weighted_loss(logits, y, weight, criterion)
        total = task if penalty is None else task + penalty(x, z, weight)
        return total, (new_buffers, z, task.detach())

    def stepping(loss_and_grad: Callable[..., Any]) -> ClientFn:
        def step(params, buffers, opt_state, x, y, weight, lr):
            grads, (_, (new_buffers, z, value)) = loss_and_grad(params, buffers, x, y, weight)
            new_params, new_state = sgd.update(params, grads, opt_state, lr)
            if post_step:
                scratch = _clone(prefixed(new_buffers, "trunk."))
                z = call_at(trunk, {**prefixed(new_params, "trunk."), **scratch}, (x,))
            return Mapped((new_params, new_buffers, new_state), (value.detach(),), (z.detach(),))

        return step

    return TwoForms(stepping(grad_and_value(loss, has_aux=True)), stepping(eager_grad_and_value(loss)))


def eager_grad_and_value(loss: Callable[..., Any]) -> Callable[..., Any]:
    """``grad_and_value(loss, has_aux=True)`` (gradient in the first argument) on plain autograd."""

    def call(params: Tensors, *args: Any) -> tuple[Tensors, tuple[torch.Tensor, Any]]:
        leaves = grad_leaves(params)
        with torch.enable_grad():
            value, aux = loss(leaves, *args)
            grads = leaf_gradients(value, leaves)
        return grads, (value.detach(), aux)

    return call


class ClientForward:
    """The client part's forward pass (state names prefixed ``trunk.``): new buffers and smashed data.

    ``folded`` is the same pass over every row at once with the clients folded into the batch
    (:mod:`fedge.engine.folded`), or None where the part does not fold; the batched executor's
    :meth:`~fedge.engine.executors.Executor.map` uses it when the rows draw no noise.

    With ``clip`` (``privacy.cut``) each sample's smashed data leaves the pass clipped to that L2 norm,
    so that the gradient taken through it is the clipped pass's.
    """

    def __init__(self, trunk: nn.Module, clip: float | None = None):
        self.trunk, self.clip = trunk, clip
        self.folded = self._folded if folds_clients(trunk) else None

    def __call__(self, buffers: Tensors, params: Tensors, x: torch.Tensor) -> Mapped:
        new_buffers = _clone(buffers)
        z = call_at(self.trunk, {**prefixed(params, "trunk."), **prefixed(new_buffers, "trunk.")}, (x,))
        return Mapped((new_buffers,), (), (self._clipped(z, 1),))

    def _folded(self, buffers: Tensors, params: Tensors, x: torch.Tensor) -> Mapped:
        z = folded_forward(self.trunk, prefixed(params, "trunk."), x)
        return Mapped((buffers,), (), (self._clipped(z, 2),))

    def _clipped(self, z: torch.Tensor, lead: int) -> torch.Tensor:
        return z if self.clip is None else clip_rows(z, self.clip, lead)


def make_forward(trunk: nn.Module, clip: float | None = None) -> ClientForward:
    """The client part's forward pass (:class:`ClientForward`), clipping each sample's output at ``clip``."""
    return ClientForward(trunk, clip)


def nopeek_penalty(alpha: float, clip: float | None = None) -> Penalty:
    """NoPeek's term (Vepakomma et al., 2020): ``alpha`` times the distance correlation of the batch's
    inputs and its smashed data over the real rows; with ``clip`` (``privacy.cut``) of the smashed data
    clipped per sample, as it is sent."""

    def penalty(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return alpha * distance_correlation(x, z if clip is None else clip_rows(z, clip), weight)

    return penalty


def make_nopeek_gradient(alpha: float) -> ClientFn:
    """For a client that back-propagates a returned cut gradient: ``fn(x, z, weight)`` -> the gradient of
    :func:`nopeek_penalty` in the smashed data ``z``, to add to the server's ``dL/dz`` before the pullback
    (the trunk's gradient of the penalty is that vector-Jacobian product)."""
    gradient = grad(nopeek_penalty(alpha), argnums=1)

    def fn(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> Mapped:
        return Mapped((), (), (gradient(x, z, weight),))

    return fn


def make_apply(sgd: Optimizer, clip_norm: float | None) -> ClientFn:
    """Apply a gradient to client parameters: clip its global norm (optional), then one SGD step."""

    def apply(params: Tensors, opt_state: Tensors, grads: Tensors, lr):
        new_params, new_state = sgd.update(params, clip_global_norm(grads, clip_norm), opt_state, lr)
        return Mapped((new_params, new_state))

    return apply


def make_server_step(
    server: nn.Module,
    sgd: Optimizer,
    clip_norm: float | None,
    grad_z: bool,
    vmappable: bool = True,
    criterion: Criterion = cross_entropy,
) -> ClientFn:
    """One server SGD step on a batch of smashed data (CSE-FSL Eq. 11 / SplitFed's server update).

    Returns the new server state, the loss, and with ``grad_z`` the cut-layer gradient ``dL/dz`` of the
    batch's mean loss (what SplitFed sends back), taken at the pre-update server parameters. The server
    gradient's global norm is clipped at ``clip_norm`` when set (FSL_OC; CSE-FSL Sec. VI-A gives no
    threshold). Server copies run under :meth:`Executor.map` and need the ``torch.func`` version
    (``vmappable``); a shared server
    model steps one batch at a time, where plain autograd computes the same gradients with half the
    per-call overhead.
    """

    def loss(params: Tensors, z, buffers: Tensors, y, weight):
        new_buffers = _clone(buffers)
        logits = call_at(server, {**params, **new_buffers}, (z,))
        return weighted_loss(logits, y, weight, criterion), new_buffers

    pure_loss_and_grad = grad_and_value(loss, argnums=(0, 1) if grad_z else 0, has_aux=True)
    eager_loss_and_grad = _eager_server_grad(loss, grad_z)

    def stepping(loss_and_grad: Callable[..., Any]) -> ClientFn:
        def step(params, buffers, opt_state, z, y, weight, lr):
            grads, (value, new_buffers) = loss_and_grad(params, z, buffers, y, weight)
            param_grads, z_grad = grads if grad_z else (grads, None)
            new_params, new_state = sgd.update(
                params, clip_global_norm(param_grads, clip_norm), opt_state, lr
            )
            return Mapped(
                (new_params, new_buffers, new_state), (value.detach(),), (z_grad,) if grad_z else ()
            )

        return step

    if vmappable:
        return TwoForms(stepping(pure_loss_and_grad), stepping(eager_loss_and_grad))
    return stepping(eager_loss_and_grad)


def _eager_server_grad(loss: Callable[..., Any], grad_z: bool) -> Callable[..., Any]:
    """The server step's ``grad_and_value`` on plain autograd: gradients in the parameters (and with
    ``grad_z`` in the smashed data ``z``), the loss and the new buffers."""

    def call(params: Tensors, z, buffers: Tensors, y, weight):
        leaves = grad_leaves(params)
        inputs = [*leaves.values()]
        if grad_z:
            z = z.detach().requires_grad_(True)
            inputs.append(z)
        with torch.enable_grad():
            value, new_buffers = loss(leaves, z, buffers, y, weight)
            grads = torch.autograd.grad(value, inputs)
        param_grads = dict(zip(leaves, grads[: len(leaves)], strict=True))
        return ((param_grads, grads[-1]) if grad_z else param_grads), (value, new_buffers)

    return call
