"""Stacked dense networks trained by hand-written kernels, with no gradient allocated per step.

Most of the papers' small models are chains of fully connected layers (an MLP, HIST's FCNN). Trained
for many clients at once under ``vmap`` and ``grad``, every step writes a weight gradient as large as
the stacked parameters, then reads it back with the parameters to update them: with a hundred clients
that is tens of megabytes per step that leave the cache, and without the allocator switch
(:mod:`fedge.engine.host`) each of those temporaries is mapped and zero-filled anew.

For a model that is only ``Linear``, ``ReLU`` and ``Flatten`` layers (in nested ``nn.Sequential``
containers, as fedge's models and a caller's ``nn.Sequential`` are), trained on the weighted-mean
cross-entropy of :func:`~fedge.engine.step.classification_loss`, :func:`dense_kernel` writes the
forward and backward passes out with batched matrix products over the client dimension. With plain
:class:`~fedge.engine.step.SGD` each layer's update is folded into its weight-gradient product:
``W <- W - lr * dY^T X`` is one ``baddbmm`` into ``W`` (into the momentum buffer with momentum), so no
gradient exists at all and each weight is read and written once. Any other optimizer (Adam, HIST's
masked SGD) gets its gradients in buffers allocated once per executor call and reused by every step.
Split learning's shared server steps its dense part by the same kernel, as a stack of one client, and
takes the cut-layer gradient from the first layer's product (:func:`server_kernel`).

The kernel computes the same gradients as autograd (the same formulas: softmax minus one-hot, the
ReLU's mask, ``dY^T X`` and ``dY W``), but a fused product rounds once where autograd's product and
separate update round twice, so its numbers agree with the sequential executor's up to rounding (about
1e-8 after a step), not bit for bit. ``engine.fused: false`` keeps the vmapped autograd step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from fedge.engine.step import SGD, ClassificationLoss, Criterion, Optimizer, Step, cross_entropy
from fedge.tensors import Tensors


@dataclass(frozen=True)
class Linear:
    """A fully connected layer of the chain: its parameters' names in the stacked state."""

    weight: str
    bias: str | None


@dataclass(frozen=True)
class Relu:
    """A ReLU of the chain."""


@dataclass(frozen=True)
class Flatten:
    """A flatten of every per-sample dimension into one (``nn.Flatten()``'s default)."""


Layer = Linear | Relu | Flatten


def _leaves(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
    """The modules a (nested) ``nn.Sequential`` applies, in order, with their parameter-name prefixes."""
    if isinstance(module, nn.Sequential) and _plain_forward(module):
        for name, child in module.named_children():
            yield from _leaves(child, f"{prefix}{name}.")
    else:
        yield prefix, module


def _plain_forward(module: nn.Module) -> bool:
    """Whether a subclass of ``nn.Sequential`` keeps its forward (applies its children in order)."""
    return type(module).forward is nn.Sequential.forward


def dense_layers(model: nn.Module) -> tuple[Layer, ...] | None:
    """The model as a chain of :data:`Layer` s, or None when it is anything else (then autograd runs it).

    Accepted: ``Linear``, ``ReLU``, ``Flatten`` over every per-sample dimension, ``Identity`` and a
    ``Dropout`` with ``p = 0``, nested in ``nn.Sequential`` containers whose forward is the sequential
    one; a model without buffers whose chain has at least one ``Linear``.
    """
    if any(True for _ in model.buffers()):
        return None
    layers: list[Layer] = []
    for prefix, leaf in _leaves(model, ""):
        if type(leaf) is nn.Linear:
            layers.append(Linear(f"{prefix}weight", None if leaf.bias is None else f"{prefix}bias"))
        elif type(leaf) is nn.ReLU:
            layers.append(Relu())
        elif type(leaf) is nn.Flatten and leaf.start_dim == 1 and leaf.end_dim == -1:
            layers.append(Flatten())
        elif type(leaf) is nn.Identity or (type(leaf) is nn.Dropout and leaf.p == 0):
            continue
        else:
            return None
    return tuple(layers) if any(isinstance(layer, Linear) for layer in layers) else None


@dataclass(frozen=True)
class DenseKernel:
    """One optimizer step of a dense chain for stacked clients, in place: the executor's ``Kernel``.

    Called as ``(params, buffers, opt_state, x, y, weight, lr, keys)`` with tensors stacked over the
    active clients (``x``: ``[clients, batch, ...]``); updates ``params`` and ``opt_state`` in place and
    returns each client's loss (the weighted mean cross-entropy of its batch, before the step).

    With plain :class:`SGD` each layer's update is folded into its weight-gradient product. Any other
    optimizer (Adam, or an SGD wrapped to mask its update) needs the gradient itself: it is written
    into ``scratch``, buffers allocated at the first step (the one with the most active clients) and
    reused by every later step of the executor's call, then the optimizer's in-place ``update_`` runs.
    """

    layers: tuple[Layer, ...]
    optimizer: Optimizer
    scratch: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)

    @property
    def fused(self) -> bool:
        """Whether the update is folded into the products (plain SGD) rather than given gradients."""
        return type(self.optimizer) is SGD

    def __call__(self, params, buffers, opt_state, x, y, weight, lr, keys) -> torch.Tensor:
        return self.step(params, opt_state, x, y, weight, lr)[0]

    @torch.no_grad()
    def step(
        self,
        params: Tensors,
        opt_state: Tensors,
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor,
        lr: float,
        input_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step in place; each client's loss and, with ``input_grad``, the loss's gradient with
        respect to ``x`` at the parameters before the step (what a split server sends back)."""
        h, fresh = x, False  # fresh: h is this step's own temporary (a ReLU may overwrite it)
        saved: list[torch.Tensor] = []  # each Linear's input, each ReLU's output
        for layer in self.layers:
            if isinstance(layer, Linear):
                saved.append(h)
                w = params[layer.weight].transpose(1, 2)
                bias = None if layer.bias is None else params[layer.bias]
                h = torch.bmm(h, w) if bias is None else torch.baddbmm(bias[:, None], h, w)
                fresh = True
            elif isinstance(layer, Relu):
                h = h.relu_() if fresh else torch.relu(h)
                saved.append(h)
            else:
                h = h.flatten(2)
        log_p = torch.log_softmax(h, dim=-1)
        picked = log_p.gather(-1, y[..., None]).squeeze(-1)
        scale = weight / weight.sum(dim=1, keepdim=True).clamp_min(1.0)
        loss = -(picked * scale).sum(dim=1)
        grad = log_p.exp_()  # d loss / d logits = (softmax - one-hot) * weight / sum(weight)
        grad.scatter_add_(-1, y[..., None], -torch.ones_like(picked)[..., None])
        grad.mul_(scale[..., None])
        grads: Tensors = {}
        first_linear = next(i for i, layer in enumerate(self.layers) if isinstance(layer, Linear))
        for i in range(len(self.layers) - 1, first_linear - 1, -1):
            layer = self.layers[i]  # (a Flatten past the first Linear sees [clients, batch, features])
            if isinstance(layer, Relu):
                grad = torch.ops.aten.threshold_backward(grad, saved.pop(), 0)  # autograd's ReLU backward
            elif isinstance(layer, Linear):
                inputs = saved.pop()
                below = torch.bmm(grad, params[layer.weight]) if i > first_linear or input_grad else None
                if self.fused:
                    self._sgd(params, opt_state, layer, grad, inputs, lr)
                else:
                    self._gradients(grads, params, layer, grad, inputs)
                if below is None:  # the first Linear, and no input gradient asked for
                    break
                grad = below
        if not self.fused:
            self.optimizer.update_(params, grads, opt_state, lr)
        return loss, grad.view(x.shape) if input_grad else None

    def _gradients(
        self, grads: Tensors, params: Tensors, layer: Linear, grad: torch.Tensor, inputs: torch.Tensor
    ) -> None:
        """One layer's gradients, ``grad^T inputs`` and ``sum grad``, written into the scratch buffers."""
        count = grad.shape[0]
        for name in (layer.weight, layer.bias):
            if name is not None and (name not in self.scratch or self.scratch[name].shape[0] < count):
                self.scratch[name] = torch.empty_like(params[name])
        grads[layer.weight] = torch.bmm(grad.transpose(1, 2), inputs, out=self.scratch[layer.weight][:count])
        if layer.bias is not None:
            grads[layer.bias] = torch.sum(grad, dim=1, out=self.scratch[layer.bias][:count])

    def _sgd(
        self,
        params: Tensors,
        state: Tensors,
        layer: Linear,
        grad: torch.Tensor,
        inputs: torch.Tensor,
        lr: float,
    ) -> None:
        """SGD on one layer with its gradients ``grad^T inputs`` (weight) and ``sum grad`` (bias), fused."""
        opt = cast(SGD, self.optimizer)  # fused: the optimizer is plain SGD
        weight = params[layer.weight]
        product = (grad.transpose(1, 2), inputs)
        if opt.momentum:
            buffer = state[layer.weight].mul_(opt.momentum)
            if opt.weight_decay:
                buffer.add_(weight, alpha=opt.weight_decay)
            buffer.baddbmm_(*product)  # (a beta = momentum inside the product measured slower)
            weight.add_(buffer, alpha=-lr)
        else:
            weight.baddbmm_(*product, beta=1.0 - lr * opt.weight_decay, alpha=-lr)
        if layer.bias is None:
            return
        bias = params[layer.bias]
        step = grad.sum(dim=1)
        if opt.weight_decay:
            step.add_(bias, alpha=opt.weight_decay)
        if opt.momentum:
            step = state[layer.bias].mul_(opt.momentum).add_(step)
        bias.add_(step, alpha=-lr)


def dense_kernel(step: Step, sample_shape: tuple[int, ...], trained: Iterable[str]) -> DenseKernel | None:
    """The kernel of ``step`` for inputs of ``sample_shape`` per sample, training the parameters
    ``trained``; None unless it is an optimizer step on the weighted-mean cross-entropy of a dense
    chain (:func:`dense_layers`) whose first ``Linear`` sees flat samples (they are flat already, or a
    ``Flatten`` comes first), every parameter of it trained (a step that trains a part, such as a
    personalised head, runs on autograd)."""
    loss = step.loss_fn
    if not (isinstance(loss, ClassificationLoss) and loss.criterion is cross_entropy):
        return None
    layers = dense_layers(loss.model)
    if layers is None or not (len(sample_shape) == 1 or isinstance(layers[0], Flatten)):
        return None
    if set(trained) != {name for name, _ in loss.model.named_parameters()}:
        return None
    return DenseKernel(layers, step.optimizer)


def server_kernel(
    module: nn.Module,
    optimizer: Optimizer,
    criterion: Criterion,
    sample_shape: tuple[int, ...],
) -> DenseKernel | None:
    """The kernel of a split-learning server part that steps on smashed data of ``sample_shape`` and may
    send back the cut-layer gradient: :func:`dense_kernel` of its loss and optimizer, provided nothing
    but a ``Flatten`` comes before its first ``Linear`` (the input gradient is the first product's)."""
    names = [name for name, _ in module.named_parameters()]
    kernel = dense_kernel(Step(ClassificationLoss(module, criterion), optimizer), sample_shape, names)
    if kernel is None:
        return None
    first = next(i for i, layer in enumerate(kernel.layers) if isinstance(layer, Linear))
    return kernel if all(isinstance(layer, Flatten) for layer in kernel.layers[:first]) else None
