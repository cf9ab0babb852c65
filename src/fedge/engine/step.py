"""Pure training steps: a loss over explicit parameters, and SGD on dicts of tensors.

Everything here is a function of its arguments (no module state is mutated), which is what lets the
batched executor run the same step under ``torch.func.vmap`` over a leading client dimension. A
:class:`Step` is such a function that also keeps its two halves (the loss and the optimizer), so the
batched executor can take gradients for all clients at once and then apply the update to the stacked
state in place (:meth:`SGD.update_`) instead of allocating a second copy of every client's parameters.
Every optimizer (:class:`SGD`, :class:`Adam`) has the same four members: ``init(params, rows=None)``,
the pure ``update`` and the in-place ``update_``, which agree bit for bit; :func:`make_optimizer`
builds the configured one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad_and_value

from fedge.config import OptimizerConfig
from fedge.data.dataset import IGNORED_TARGET
from fedge.engine.bind import call_at
from fedge.tensors import Tensors

# (logits, labels) -> the loss of every sample (no reduction): the per-sample training criterion
Criterion = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LossFn = Callable[[Tensors, Tensors, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, Tensors]]
StepFn = Callable[..., tuple[Tensors, Tensors, Tensors, torch.Tensor]]


def grad_leaves(params: Tensors) -> Tensors:
    """``params`` as fresh autograd leaves (detached, requiring gradients)."""
    return {name: p.detach().requires_grad_(True) for name, p in params.items()}


def leaf_gradients(output: torch.Tensor, leaves: Tensors, grad_output: torch.Tensor | None = None) -> Tensors:
    """``d output / d leaves`` by plain autograd (a vector-Jacobian product with ``grad_output`` when
    given), zeros for a leaf the output does not reach."""
    values = torch.autograd.grad(output, list(leaves.values()), grad_output, allow_unused=True)
    pairs = zip(leaves.items(), values, strict=True)
    return {name: torch.zeros_like(p) if g is None else g for (name, p), g in pairs}


def parameters_of(module: nn.Module) -> Tensors:
    """The module's parameters as a detached dict (the functional view of its weights)."""
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def buffers_of(module: nn.Module) -> Tensors:
    """The module's buffers (e.g. BatchNorm running statistics) as a detached dict."""
    return {name: b.detach().clone() for name, b in module.named_buffers()}


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-sample cross-entropy: the default training criterion. For a sequence (logits ``[B, V, T]``,
    targets ``[B, T]``: a language model) a sample's loss is the mean over its targets, a padded
    sequence's :data:`~fedge.data.dataset.IGNORED_TARGET` positions left out: each sample weighs the same
    however many real tokens it has, as every sample does elsewhere in fedge (Hugging Face's Trainer
    weighs tokens instead). On the CPU, a sum divided by the count is exactly PyTorch's mean of an
    unpadded sequence. ``label_smoothing`` is ``train.label_smoothing``."""
    loss = F.cross_entropy(
        logits, y, reduction="none", ignore_index=IGNORED_TARGET, label_smoothing=label_smoothing
    )
    if loss.dim() == 1:
        return loss
    return loss.flatten(1).sum(dim=1) / y.ne(IGNORED_TARGET).flatten(1).sum(dim=1).clamp_min(1)


def weighted_mean(values: torch.Tensor, weight: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of per-sample ``values`` over the real samples (``weight`` 1, padding 0), over ``dim`` or all
    of them; an all-padding batch gives 0 rather than 0 / 0."""
    if dim is None:
        return (values * weight).sum() / weight.sum().clamp_min(1.0)
    return (values * weight).sum(dim=dim) / weight.sum(dim=dim).clamp_min(1.0)


@dataclass(frozen=True)
class ClassificationLoss:
    """Weighted mean of ``criterion`` of ``model`` at explicit parameters: a :data:`LossFn`.

    ``weight`` holds 1 for real samples and 0 for padding; the loss is the mean over real samples, so
    a padded batch gives exactly the gradient of its real rows. Buffers are cloned before the forward
    pass so BatchNorm's in-place running-stat updates land in the returned copy, not the input. The
    model and criterion stay readable, so an executor can recognise a loss it has a faster kernel for
    (:mod:`fedge.engine.dense`).
    """

    model: nn.Module
    criterion: Criterion = cross_entropy

    def __call__(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ):
        new_buffers = {name: b.clone() for name, b in buffers.items()}
        logits = call_at(self.model, {**params, **new_buffers}, (x,))
        per_sample = self.criterion(logits, y)
        return weighted_mean(per_sample, weight), new_buffers


def classification_loss(model: nn.Module, criterion: Criterion = cross_entropy) -> ClassificationLoss:
    """The weighted-mean ``criterion`` (cross-entropy by default) of ``model``: a :data:`LossFn`."""
    return ClassificationLoss(model, criterion)


class Optimizer(Protocol):
    """What a local step needs of an optimizer (:class:`SGD`, :class:`Adam`)."""

    def init(self, params: Tensors, rows: int | None = None) -> Tensors: ...

    def update(
        self, params: Tensors, grads: Tensors, state: Tensors, lr: float
    ) -> tuple[Tensors, Tensors]: ...

    def update_(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> None: ...

    def select(self, state: Tensors, names: Iterable[str]) -> Tensors: ...


@dataclass(frozen=True)
class SGD:
    """SGD with momentum and weight decay, with PyTorch's update rule (dampening 0, no Nesterov).

    ``d = g + wd * p``; ``m = mu * m + d`` (the zero-initialised buffer makes the first step ``m = d``,
    as in ``torch.optim.SGD``); ``p = p - lr * m``, each computed as ``torch.optim.SGD`` computes it.
    """

    momentum: float = 0.0
    weight_decay: float = 0.0

    def init(self, params: Tensors, rows: int | None = None) -> Tensors:
        """Optimizer state for ``params``: momentum buffers, or nothing for plain SGD (``rows``: the
        params are stacked with that many rows; momentum buffers have the params' shape either way)."""
        return {name: torch.zeros_like(p) for name, p in params.items()} if self.momentum else {}

    def select(self, state: Tensors, names: Iterable[str]) -> Tensors:
        """The part of ``state`` that steps the parameters ``names`` (a subset of the model)."""
        return {name: state[name] for name in names if name in state}

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


ADAM_STEP = "step"  # Adam's per-row step counter in the optimizer state (float64: exact bias corrections)


def _leading(count: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``count`` (one value per row, or one value) shaped to broadcast against ``like``."""
    return count.reshape(count.shape + (1,) * (like.dim() - count.dim()))


@dataclass(frozen=True)
class Adam:
    """Adam (Kingma and Ba, 2015) with ``torch.optim.Adam``'s rule (L2 weight decay, no AMSGrad).

    ``d = g + wd * p``; ``m = b1 m + (1 - b1) d``; ``v = b2 v + (1 - b2) d^2``; with the step count
    ``k``: ``p = p - lr / (1 - b1^k) * m / (sqrt(v) / sqrt(1 - b2^k) + eps)``. The state holds ``m.NAME``,
    ``v.NAME`` and the step count of each row (so clients that took different numbers of steps carry
    their own bias corrections, on either executor).
    """

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def init(self, params: Tensors, rows: int | None = None) -> Tensors:
        """Zero moments and a zero step count (one per row when ``params`` are stacked ``rows`` high)."""
        some = next(iter(params.values()))
        state = {f"{kind}.{name}": torch.zeros_like(p) for kind in "mv" for name, p in params.items()}
        shape = () if rows is None else (rows,)
        state[ADAM_STEP] = torch.zeros(shape, dtype=torch.float64, device=some.device)
        return state

    def select(self, state: Tensors, names: Iterable[str]) -> Tensors:
        """The moments of the parameters ``names`` and the step count (a subset of the model)."""
        chosen = {f"{kind}.{name}": state[f"{kind}.{name}"] for kind in "mv" for name in names}
        return {**chosen, ADAM_STEP: state[ADAM_STEP]}

    def _scales(self, count: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The step size ``lr / (1 - b1^k)`` and ``sqrt(1 - b2^k)`` at step count ``count``, in float64."""
        beta1, beta2 = self.betas
        return lr / (1 - beta1**count), torch.sqrt(1 - beta2**count)

    def update(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> tuple[Tensors, Tensors]:
        """The updated parameters and optimizer state, as new tensors (the pure form)."""
        beta1, beta2 = self.betas
        count = state[ADAM_STEP] + 1
        step_size, root = self._scales(count, lr)
        new_params, new_state = {}, {ADAM_STEP: count}
        for name, p in params.items():
            d = grads[name].add(p, alpha=self.weight_decay) if self.weight_decay else grads[name]
            m = state[f"m.{name}"].lerp(d, 1 - beta1)
            v = state[f"v.{name}"].mul(beta2).addcmul(d, d, value=1 - beta2)
            denom = v.sqrt().div(_leading(root, p).to(p.dtype)).add(self.eps)
            new_params[name] = p.sub(m.div(denom).mul(_leading(step_size, p).to(p.dtype)))
            new_state[f"m.{name}"], new_state[f"v.{name}"] = m, v
        return new_params, new_state

    @torch.no_grad()
    def update_(self, params: Tensors, grads: Tensors, state: Tensors, lr: float) -> None:
        """:meth:`update` in place (``grads`` used as scratch), the same kernels in the same order."""
        beta1, beta2 = self.betas
        count = state[ADAM_STEP].add_(1)
        step_size, root = self._scales(count, lr)
        for name, p in params.items():
            d = grads[name]
            if self.weight_decay:
                d.add_(p, alpha=self.weight_decay)
            m = state[f"m.{name}"].lerp_(d, 1 - beta1)
            v = state[f"v.{name}"].mul_(beta2).addcmul_(d, d, value=1 - beta2)
            denom = v.sqrt().div_(_leading(root, p).to(p.dtype)).add_(self.eps)
            p.sub_(m.div(denom).mul_(_leading(step_size, p).to(p.dtype)))


def make_optimizer(cfg: OptimizerConfig) -> SGD | Adam:
    """The optimizer a config block names (its ``lr`` is passed per call, as it may decay)."""
    if cfg.kind == "adam":
        return Adam(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return SGD(momentum=cfg.momentum, weight_decay=cfg.weight_decay)


@dataclass(frozen=True)
class Step:
    """One local step of ``loss_fn`` followed by ``optimizer``: a pure :data:`StepFn`.

    Calling it maps ``(params, buffers, opt_state, x, y, weight, lr)`` to the new state and the loss.
    :meth:`gradients` is the first half alone, for executors that apply the update themselves.
    """

    loss_fn: LossFn
    optimizer: Optimizer

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
        leaves = grad_leaves(params)
        with torch.enable_grad():
            loss, new_buffers = self.loss_fn(leaves, buffers, x, y, weight)
            grads = leaf_gradients(loss, leaves)
        return grads, loss.detach(), {name: b.detach() for name, b in new_buffers.items()}

    def __call__(self, params, buffers, opt_state, x, y, weight, lr):
        grads, loss, new_buffers = self.gradients(params, buffers, x, y, weight)
        new_params, new_state = self.optimizer.update(params, grads, opt_state, lr)
        return new_params, new_buffers, new_state, loss


def make_step(loss_fn: LossFn, optimizer: Optimizer) -> Step:
    """One local step: ``(params, buffers, opt_state, x, y, weight, lr)`` to the same state and the loss."""
    return Step(loss_fn, optimizer)
