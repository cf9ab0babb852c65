"""Pure training steps: a loss over explicit parameters, and SGD on dicts of tensors.

Everything here is a function of its arguments (no module state is mutated), which is what lets the
batched executor run the same step under ``torch.func.vmap`` over a leading client dimension.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value

Tensors = dict[str, torch.Tensor]
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
    as in ``torch.optim.SGD``); ``p = p - lr * m``.
    """

    momentum: float = 0.0
    weight_decay: float = 0.0

    def init(self, params: Tensors) -> Tensors:
        """Optimizer state for ``params``: momentum buffers, or nothing for plain SGD."""
        return {name: torch.zeros_like(p) for name, p in params.items()} if self.momentum else {}

    def update(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> tuple[Tensors, Tensors]:
        new_params, new_state = {}, {}
        for name, p in params.items():
            d = grads[name] + self.weight_decay * p if self.weight_decay else grads[name]
            if self.momentum:
                d = self.momentum * state[name] + d
                new_state[name] = d
            new_params[name] = p - lr * d
        return new_params, new_state


def make_step(loss_fn: LossFn, optimizer: SGD) -> StepFn:
    """One local step: ``(params, buffers, opt_state, x, y, weight, lr)`` to the same state and the loss."""
    loss_and_grad = grad_and_value(loss_fn, has_aux=True)

    def step(params, buffers, opt_state, x, y, weight, lr):
        grads, (loss, new_buffers) = loss_and_grad(params, buffers, x, y, weight)
        new_params, new_state = optimizer.update(params, grads, opt_state, lr)
        return new_params, new_buffers, new_state, loss.detach()

    return step
