"""DP-SGD for stacked clients of a chain of layers without ``vmap(grad)``: the batched executor's private
kernel for dense and convolutional chains (an MLP, LeNet-5, the papers' small CNNs).

:class:`~fedge.engine.private_step.PrivateStep` gets every sample's gradient from ``vmap(grad)`` inside
the vmap over clients. For a chain of ``Conv2d``, ``MaxPool2d``, ``ReLU``, ``Flatten`` and ``Linear``
layers (in nested ``nn.Sequential`` containers) :class:`PrivateChainKernel` writes the passes out by
hand instead, over all clients' samples at once: one forward pass, one backward pass that keeps each
layer's output gradient, then

* a ``Linear`` layer's gradient on sample i is the outer product ``d_i a_i^T`` of its output gradient
  and its input, so its squared norm is ``|d_i|^2 |a_i|^2`` (plus ``|d_i|^2`` for the bias) and no
  per-sample gradient is made (Goodfellow's trick, "Efficient per-example gradient computations", 2015);
  its clipped sum is ``(f * d)^T a`` with each sample's factor ``f_i = min(1, C / |g_i|)``: one
  batched product, as in non-private training;
* a ``Conv2d`` layer's per-sample weight gradients are one grouped ``convolution_backward`` over every
  sample (a group per sample, so each group's weight gradient is that sample's), small for the
  convolutions of such models (LeNet-5: 150 and 2,400 values a sample); its norms come from them and its
  clipped sum is their ``f``-weighted sum.

The numbers are the per-sample path's up to rounding (the same formulas: softmax minus one-hot, the
ReLU's mask, the pooling's argmax, the convolutions' gradients), and the noise is drawn as there (one
flat draw per row over the parameters in order, as
:meth:`~fedge.engine.private_step.PrivateStep.noisy_gradients` draws it); each clipped sum is added into
its slice of the noise in place, a ``Linear`` weight's by the product itself (``baddbmm``), so a step makes
no second parameter-sized tensor: with the MNIST MLP the noise is as large as the model for every client
and step, and the two passes this saves (scaling the noise, adding the sums) were about 15 % of a W10
round (``benchmarks/dp_sgd.py``).
``engine.fused: false`` keeps the ``vmap(grad)`` path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedge.engine.dense import Flatten, Linear, Relu, _leaves
from fedge.engine.pooling import MAXIMA_DEVICES, maxima_and_index
from fedge.engine.private_step import PrivateStep
from fedge.engine.step import ClassificationLoss, cross_entropy
from fedge.tensors import Tensors


@dataclass(frozen=True)
class Conv2d:
    """A 2-d convolution of the chain (one group, zero padding): its parameters' names and geometry."""

    weight: str
    bias: str | None
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]


@dataclass(frozen=True)
class MaxPool2d:
    """A 2-d max pooling of the chain; ``halving``: a 2 x 2 window of stride 2 (pooled as three maxima
    on :data:`~fedge.engine.pooling.MAXIMA_DEVICES`)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool

    @property
    def halving(self) -> bool:
        plain = self.padding == (0, 0) and self.dilation == (1, 1) and not self.ceil_mode
        return plain and self.kernel == (2, 2) and self.stride == (2, 2)


Layer = Linear | Conv2d | MaxPool2d | Relu | Flatten
CPU_CHAIN_CLIENTS = 10
"""Clients per step of the kernel on a CPU. A step's temporaries are a few of every client's activations
and parameters, and a step over a hundred clients runs from memory: a W10 round (100 clients, batches of
32, one thread, 2-core Xeon) took 0.49 s for the MLP and 0.97 s for LeNet-5 in one chunk, 0.35 s and
0.82 s in chunks of 10, about as fast from 7 to 17 clients a chunk for both."""
IM2COL_CHANNELS = 4
"""Input channels below which a convolution's per-sample weight gradients on the CPU come from PyTorch's
im2col kernel rather than oneDNN's, which handles groups of so few channels poorly: for LeNet-5's first
convolution on 3,200 MNIST samples 24 ms against oneDNN's 51 ms (one thread, 2-core Xeon), for 3-channel
ones 1.8-3.5 times less; from 6 channels on the two were even or oneDNN faster."""


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _layer(prefix: str, leaf: nn.Module, dims: int) -> Layer | None:
    """``leaf`` as a chain layer for a per-sample input of ``dims`` dimensions (3: an image ``[C, H, W]``,
    1: flat), or None where the kernel cannot take it there."""
    image = dims == 3
    if type(leaf) is nn.Linear and dims == 1:
        return Linear(f"{prefix}weight", None if leaf.bias is None else f"{prefix}bias")
    if type(leaf) is nn.Conv2d and image and leaf.groups == 1 and leaf.padding_mode == "zeros":
        if isinstance(leaf.padding, str):
            return None
        bias = None if leaf.bias is None else f"{prefix}bias"
        geometry = (_pair(leaf.stride), _pair(leaf.padding), _pair(leaf.dilation))
        return Conv2d(f"{prefix}weight", bias, *geometry)
    if type(leaf) is nn.MaxPool2d and image and not leaf.return_indices:
        stride = leaf.kernel_size if leaf.stride is None else leaf.stride
        sizes = (_pair(leaf.kernel_size), _pair(stride), _pair(leaf.padding), _pair(leaf.dilation))
        return MaxPool2d(*sizes, bool(leaf.ceil_mode))
    if type(leaf) is nn.ReLU:
        return Relu()
    if type(leaf) is nn.Flatten and leaf.start_dim == 1 and leaf.end_dim == -1:
        return Flatten()
    return None


def chain_layers(model: nn.Module, sample_shape: tuple[int, ...]) -> tuple[Layer, ...] | None:
    """The model as a chain of :data:`Layer` s on samples of ``sample_shape``, or None when it is
    anything else: convolutions and poolings on images ``[C, H, W]``, ``Linear`` layers on flat samples
    (flat already, or after a ``Flatten`` of every per-sample dimension), flat logits at the end;
    ``Identity`` and a ``Dropout`` with ``p = 0`` are skipped; a model without buffers with at least one
    ``Linear`` or ``Conv2d``."""
    if any(True for _ in model.buffers()):
        return None
    layers: list[Layer] = []
    dims = len(sample_shape)
    for prefix, leaf in _leaves(model, ""):
        if type(leaf) is nn.Identity or (type(leaf) is nn.Dropout and leaf.p == 0):
            continue
        layer = _layer(prefix, leaf, dims)
        if layer is None:
            return None
        dims = 1 if isinstance(layer, Flatten) else dims
        layers.append(layer)
    trains = any(isinstance(layer, (Linear, Conv2d)) for layer in layers)
    return tuple(layers) if trains and dims == 1 else None


@contextmanager
def _without_onednn() -> Iterator[None]:
    """Within the block, convolutions run on PyTorch's own CPU kernels (oneDNN switched off)."""
    before = torch.backends.mkldnn.set_flags(False)[0]
    try:
        yield
    finally:
        torch.backends.mkldnn.set_flags(before)


def _conv_weight_per_sample(grad: torch.Tensor, inputs: torch.Tensor, shape: torch.Size, layer: Conv2d):
    """``[clients, batch, O * C * kh * kw]``: each sample's weight gradient of a convolution, from its
    output gradient ``grad`` and its input (``[clients, batch, ...]``), by one convolution backward with
    a group per sample (on the CPU with PyTorch's im2col kernel below :data:`IM2COL_CHANNELS`)."""
    samples = grad.shape[0] * grad.shape[1]
    stand_in = grad.new_empty(samples * shape[0], *shape[1:])  # only its shape is read
    im2col = grad.device.type == "cpu" and shape[1] < IM2COL_CHANNELS
    with _without_onednn() if im2col else nullcontext():
        per_sample = torch.ops.aten.convolution_backward(
            grad.reshape(1, -1, *grad.shape[-2:]), inputs.reshape(1, -1, *inputs.shape[-2:]), stand_in,
            None, layer.stride, layer.padding, layer.dilation, False, [0, 0], samples, [False, True, False],
        )[1]  # fmt: skip
    return per_sample.view(*grad.shape[:2], -1)


@dataclass(frozen=True)
class PrivateChainKernel:
    """One DP-SGD step of a chain (:func:`chain_layers`) for stacked clients, in place: the executor's
    ``Kernel`` (see the module's docstring)."""

    layers: tuple[Layer, ...]
    step: PrivateStep

    @property
    def per_sample(self) -> tuple[str, ...]:
        """The parameters whose per-sample gradients a step holds: the convolutions'."""
        convs = (layer for layer in self.layers if isinstance(layer, Conv2d))
        return tuple(name for conv in convs for name in (conv.weight, conv.bias) if name is not None)

    @torch.no_grad()
    def __call__(self, params, buffers, opt_state, x, y, weight, lr, keys) -> torch.Tensor:
        saved: list[torch.Tensor] = []  # Linear, Conv2d, MaxPool2d inputs (and indices), ReLU outputs
        h, fresh = x, False  # fresh: h is this step's own unsaved temporary (a ReLU may overwrite it)
        for layer in self.layers:
            if isinstance(layer, Linear):
                saved.append(h)
                w = params[layer.weight].transpose(1, 2)
                bias = None if layer.bias is None else params[layer.bias][:, None]
                h, fresh = (torch.bmm(h, w) if bias is None else torch.baddbmm(bias, h, w)), True
            elif isinstance(layer, Conv2d):
                saved.append(h)
                h, fresh = self._conv(params, layer, h), True
            elif isinstance(layer, MaxPool2d):
                pooled, index = self._pool(layer, h.flatten(0, 1))
                saved.extend((h, index))
                h, fresh = pooled.unflatten(0, h.shape[:2]), True
            elif isinstance(layer, Relu):
                h = h.relu_() if fresh else torch.relu(h)
                saved.append(h)
                fresh = False
            else:
                saved.append(h)
                h = h.flatten(2)
        log_p = torch.log_softmax(h, dim=-1)
        picked = log_p.gather(-1, y[..., None]).squeeze(-1)
        loss = -(picked * weight).sum(dim=1) / weight.sum(dim=1).clamp_min(1.0)
        grad = log_p.exp_()  # each sample's own loss: d loss_i / d logits_i = (softmax - one-hot) w_i
        grad.scatter_add_(-1, y[..., None], -torch.ones_like(picked)[..., None])
        grad.mul_(weight[..., None])
        privacy_keys, width = [int(k) for k in keys[:, 0]], x.shape[1]
        if self.step.mechanism.multiplier == 0.0:
            sums = self._clipped_sums(params, saved, grad, None)
            grads = self.step.noisy_gradients({name: sums[name] for name in params}, privacy_keys, width)
        else:
            grads = self._noisy_gradients(params, saved, grad, privacy_keys, width)
        self.step.optimizer.update_(params, grads, opt_state, lr)
        return loss

    def _noisy_gradients(
        self, params: Tensors, saved: list[torch.Tensor], grad: torch.Tensor, keys: list[int], width: int
    ) -> Tensors:
        """The rows' noisy gradients, ``(clipped sum + noise) / width``, as
        :meth:`~fedge.engine.private_step.PrivateStep.noisy_gradients` makes them (one flat draw per row
        over the parameters in order), with every clipped sum added straight into its slice of the noise
        (a ``Linear`` weight's by the product itself): no separate sums to allocate and add."""
        some = next(iter(params.values()))
        sizes = [p[0].numel() for p in params.values()]
        noise = self.step.mechanism.noise(keys, sum(sizes)).to(device=some.device, dtype=some.dtype)
        views, offset = {}, 0
        for (name, p), size in zip(params.items(), sizes, strict=True):
            views[name] = noise[:, offset : offset + size].view(p.shape)
            offset += size
        self._clipped_sums(params, saved, grad, views, width)
        return views

    def _clipped_sums(
        self,
        params: Tensors,
        saved: list[torch.Tensor],
        grad: torch.Tensor,
        into: Tensors | None,
        width: int = 1,
    ) -> Tensors:
        """Each client's sum of clipped per-sample gradients, by one backward pass from the per-sample
        loss gradient ``grad`` through the forward pass's ``saved`` tensors; where ``into`` is given,
        ``(into + sum) / width`` in place in its tensors (returned then)."""
        linear: list[tuple[Linear, torch.Tensor, torch.Tensor]] = []  # (layer, output gradient, input)
        conv: list[tuple[Conv2d, torch.Tensor, torch.Tensor | None]] = []  # per-sample weight, bias grads
        squares = torch.zeros(grad.shape[:2], dtype=grad.dtype, device=grad.device)
        first = next(i for i, layer in enumerate(self.layers) if isinstance(layer, (Linear, Conv2d)))
        for i in range(len(self.layers) - 1, first - 1, -1):
            layer, below = self.layers[i], i > first
            if isinstance(layer, Relu):
                grad = torch.ops.aten.threshold_backward(grad, saved.pop(), 0)
            elif isinstance(layer, Flatten):
                grad = grad.view(saved.pop().shape)
            elif isinstance(layer, MaxPool2d):
                index, inputs = saved.pop(), saved.pop()
                grad = torch.ops.aten.max_pool2d_with_indices_backward(
                    grad.flatten(0, 1), inputs.flatten(0, 1), layer.kernel, layer.stride, layer.padding,
                    layer.dilation, layer.ceil_mode, index,
                ).view(inputs.shape)  # fmt: skip
            elif isinstance(layer, Linear):
                inputs = saved.pop()
                outputs = grad.square().sum(dim=-1)
                squares += outputs * inputs.square().sum(dim=-1)
                if layer.bias is not None:
                    squares += outputs
                linear.append((layer, grad, inputs))
                if below:
                    grad = torch.bmm(grad, params[layer.weight])
            else:
                inputs = saved.pop()
                w = params[layer.weight]
                per_weight = _conv_weight_per_sample(grad, inputs, w.shape[1:], layer)
                squares += torch.linalg.vector_norm(per_weight, dim=-1).square_()
                per_bias = None if layer.bias is None else grad.sum(dim=(-2, -1))
                if per_bias is not None:
                    squares += per_bias.square().sum(dim=-1)
                conv.append((layer, per_weight, per_bias))
                if below:
                    grad = self._conv_input_grad(w, layer, grad, inputs)
        clip = self.step.mechanism.clip
        factor = (clip / squares.sqrt().clamp_min(torch.finfo(squares.dtype).tiny)).clamp(max=1.0)
        sums: Tensors = {}

        def put(name: str, value: torch.Tensor) -> None:
            sums[name] = value if into is None else into[name].add_(value).div_(width)

        for linear_layer, out_grad, inputs in linear:
            scaled = out_grad * factor[..., None]
            if into is None:
                sums[linear_layer.weight] = torch.bmm(scaled.transpose(1, 2), inputs)
            else:  # one pass: the product added into the noise, both scaled by 1 / width; the output
                # gradients transposed into rows first, which BLAS multiplies faster than a strided view
                sums[linear_layer.weight] = into[linear_layer.weight].baddbmm_(
                    scaled.transpose(1, 2).contiguous(), inputs, beta=1 / width, alpha=1 / width
                )
            if linear_layer.bias is not None:
                put(linear_layer.bias, scaled.sum(dim=1))
        weights = factor[:, None]  # [clients, 1, batch]: the factor-weighted sum over a client's samples
        for conv_layer, per_weight, per_bias in conv:
            put(conv_layer.weight, torch.bmm(weights, per_weight).view(params[conv_layer.weight].shape))
            if conv_layer.bias is not None and per_bias is not None:
                put(conv_layer.bias, torch.bmm(weights, per_bias).squeeze(1))
        return sums

    @staticmethod
    def _conv(params: Tensors, layer: Conv2d, h: torch.Tensor) -> torch.Tensor:
        """Each client's convolution of its samples (the call the sequential executor makes for it)."""
        biases = [None] * h.shape[0] if layer.bias is None else params[layer.bias].unbind(0)
        geometry = (layer.stride, layer.padding, layer.dilation)
        clients = zip(h.unbind(0), params[layer.weight].unbind(0), biases, strict=True)
        return torch.stack([F.conv2d(xc, wc, bc, *geometry) for xc, wc, bc in clients])

    @staticmethod
    def _conv_input_grad(w: torch.Tensor, layer: Conv2d, grad: torch.Tensor, inputs: torch.Tensor):
        """The loss's gradient with respect to a convolution's input, client by client."""
        geometry = (layer.stride, layer.padding, layer.dilation, False, [0, 0], 1, [True, False, False])
        clients = zip(grad.unbind(0), inputs.unbind(0), w.unbind(0), strict=True)
        return torch.stack(
            [torch.ops.aten.convolution_backward(g, a, wc, None, *geometry)[0] for g, a, wc in clients]
        )

    @staticmethod
    def _pool(layer: MaxPool2d, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pooled maxima of ``h`` (``[samples, C, H, W]``) and ``max_pool2d``'s index of each."""
        if layer.halving and h.device.type in MAXIMA_DEVICES:
            return maxima_and_index(h)
        geometry = (layer.kernel, layer.stride, layer.padding, layer.dilation, layer.ceil_mode)
        return F.max_pool2d_with_indices(h, *geometry)


def clients_per_chain(device: torch.device) -> int | None:
    """At most how many clients one :class:`PrivateChainKernel` step takes on ``device``: on a CPU
    :data:`CPU_CHAIN_CLIENTS`, elsewhere no bound (None)."""
    return CPU_CHAIN_CLIENTS if device.type == "cpu" else None


def private_chain_kernel(
    step: PrivateStep, sample_shape: tuple[int, ...], trained: Iterable[str]
) -> PrivateChainKernel | None:
    """:class:`PrivateChainKernel` of ``step`` on samples of ``sample_shape`` training ``trained``, or
    None unless it is the weighted-mean cross-entropy of a chain (:func:`chain_layers`) whose every
    parameter is trained."""
    loss = step.loss_fn
    if not (isinstance(loss, ClassificationLoss) and loss.criterion is cross_entropy):
        return None
    layers = chain_layers(loss.model, sample_shape)
    if layers is None or set(trained) != {name for name, _ in loss.model.named_parameters()}:
        return None
    return PrivateChainKernel(layers, step)
