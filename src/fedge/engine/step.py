"""Pure training steps: a loss over explicit parameters, and SGD on dicts of tensors.

Everything here is a function of its arguments (no module state is mutated), which is what lets the
batched executor run the same step under ``torch.func.vmap`` over a leading client dimension. A
:class:`Step` is such a function that also keeps its two halves (the loss and the optimizer), so the
batched executor can take gradients for all clients at once and then apply the update to the stacked
state in place (:meth:`SGD.update_`) instead of allocating a second copy of every client's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value

from fedge.tensors import Tensors

LossFn = Callable[[Tensors, Tensors, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, Tensors]]
StepFn = Callable[..., tuple[Tensors, Tensors, Tensors, torch.Tensor]]


def parameters_of(module: nn.Module) -> Tensors:
    """The module's parameters as a detached dict (the functional view of its weights)."""
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def buffers_of(module: nn.Module) -> Tensors:
    """The module's buffers (e.g. BatchNorm running statistics) as a detached dict."""
    return {name: b.detach().clone() for name, b in module.named_buffers()}


def classification_loss(model: nn.Module) -> LossFn:
    """Weighted mean cross-entropy of ``model`` evaluated at explicit parameters and buffers.

    ``weight`` holds 1 for real samples and 0 for padding; the loss is the mean over real samples, so
    a padded batch gives exactly the gradient of its real rows. Buffers are cloned before the forward
    pass so BatchNorm's in-place running-stat updates land in the returned copy, not the input.
    """

    def loss(params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor):
        new_buffers = {name: b.clone() for name, b in buffers.items()}
        logits = functional_call(model, {**params, **new_buffers}, (x,))
        per_sample = F.cross_entropy(logits, y, reduction="none")
        return (per_sample * weight).sum() / weight.sum().clamp_min(1.0), new_buffers

    return loss


@dataclass(frozen=True)
class SGD:
    """SGD with momentum and weight decay, with PyTorch's update rule (dampening 0, no Nesterov).

    ``d = g + wd * p``; ``m = mu * m + d`` (the zero-initialised buffer makes the first step ``m = d``,
    as in ``torch.optim.SGD``); ``p = p - lr * m``, each computed as ``torch.optim.SGD`` computes it.
    """

    momentum: float = 0.0
    weight_decay: float = 0.0

    def init(self, params: Tensors) -> Tensors:
        """Optimizer state for ``params``: momentum buffers, or nothing for plain SGD."""
        return {name: torch.zeros_like(p) for name, p in params.items()} if self.momentum else {}

    def update(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> tuple[Tensors, Tensors]:
        """The updated parameters and optimizer state, as new tensors (the pure form)."""
        new_params, new_state = {}, {}
        for name, p in params.items():
            d = grads[name].add(p, alpha=self.weight_decay) if self.weight_decay else grads[name]
            if self.momentum:
                d = state[name].mul(self.momentum).add(d)
                new_state[name] = d
            new_params[name] = p.add(d, alpha=-lr)
        return new_params, new_state

    @torch.no_grad()
    def update_(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> None:
        """:meth:`update` in place: writes ``params`` and ``state``, and uses ``grads`` as scratch.

        The same rule on tensors of any leading shape (one client or a stacked group), one pass over
        memory per term: with hundreds of clients the stacked state no longer fits in cache, so an
        update that allocates and re-reads new tensors costs more than the gradient itself. It runs
        the same kernels in the same order as :meth:`update` (``add`` with ``alpha``, as
        ``torch.optim.SGD`` does), so both give bit-identical results from the same gradients:
        training amplifies even last-bit differences over a few dozen steps.
        """
        for name, p in params.items():
            d = grads[name]
            if self.weight_decay:
                d.add_(p, alpha=self.weight_decay)
            if self.momentum:
                d = state[name].mul_(self.momentum).add_(d)
            p.add_(d, alpha=-lr)


@dataclass(frozen=True)
class Step:
    """One local step of ``loss_fn`` followed by ``optimizer``: a pure :data:`StepFn`.

    Calling it maps ``(params, buffers, opt_state, x, y, weight, lr)`` to the new state and the loss.
    :meth:`gradients` is the first half alone, for executors that apply the update themselves.
    """

    loss_fn: LossFn
    optimizer: SGD

    def gradients(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ) -> tuple[Tensors, torch.Tensor, Tensors]:
        """Gradients of the loss with respect to ``params``, the loss, and the updated buffers."""
        grads, (loss, new_buffers) = grad_and_value(self.loss_fn, has_aux=True)(params, buffers, x, y, weight)
        return grads, loss.detach(), new_buffers

    def eager_gradients(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ) -> tuple[Tensors, torch.Tensor, Tensors]:
        """:meth:`gradients` by plain autograd, for one client at a time (not under ``vmap``).

        The same operations and backward formulas, so the same numbers, without ``torch.func``'s
        per-call transform and pytree work, which dominate a small model's step on one client.
        """
        leaves = {name: p.detach().requires_grad_(True) for name, p in params.items()}
        with torch.enable_grad():
            loss, new_buffers = self.loss_fn(leaves, buffers, x, y, weight)
            values = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        grads = {
            name: torch.zeros_like(p) if g is None else g
            for (name, p), g in zip(leaves.items(), values, strict=True)
        }
        return grads, loss.detach(), {name: b.detach() for name, b in new_buffers.items()}

    def __call__(self, params, buffers, opt_state, x, y, weight, lr):
        grads, loss, new_buffers = self.gradients(params, buffers, x, y, weight)
        new_params, new_state = self.optimizer.update(params, grads, opt_state, lr)
        return new_params, new_buffers, new_state, loss


def make_step(loss_fn: LossFn, optimizer: SGD) -> Step:
    """One local step: ``(params, buffers, opt_state, x, y, weight, lr)`` to the same state and the loss."""
    return Step(loss_fn, optimizer)
