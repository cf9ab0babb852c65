"""2-d convolutions with per-client weights under ``vmap``: one plain convolution per client.

Under ``torch.func.vmap`` with per-client weights, PyTorch turns ``conv2d`` into one grouped
convolution over a ``[N, clients * C, H, W]`` layout. On CPU that is the slow way to train many small
convolutional clients, for three measured reasons (LeNet-5 on MNIST, 100 clients x 32 images, one
thread, 2-core AMD EPYC):

* the grouped kernel is slower than the plain convolution of each client: forward 24 ms against 15 ms
  for the first layer, 22 ms against 9 ms for the second; its weight gradient was also fragile when
  other processes loaded the cores (0.07 s per step idle, 3.3 s loaded);
* its output layout is not the one the following layers take: a max-pool under vmap merges the client
  dimension into the batch dimension, so every pooling copied the whole activation into
  ``[clients * N, C, H, W]`` and the next convolution copied it back;
* a whole CSE-FSL round (W4 of ``benchmarks.families``) went from 6.9 s to 4.5 s with the rewrite
  below, and a FedAvg LeNet-5 round (W2 of ``benchmarks.engine``) from 4.6 s to 3.5 s.

:class:`PerClientConv2d` is ``F.conv2d`` with its own vmap rule: each client's convolution, forward and
backward, is the very kernel call the sequential executor makes for that client (so the results are
bit-identical to it), and the output is stacked client-first, ``[clients, N, C, H, W]``, which pooling,
activations and dense layers take without a copy. :class:`fedge.engine.kernels.batched_kernels` routes
every ``conv2d`` of a block of code through it; the batched executor wraps its vmapped steps in it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

Pair = int | tuple[int, int]
PER_CLIENT_DEVICES = frozenset({"cpu"})
"""Devices whose convolutions run one per client. On CUDA, PyTorch's own vmap rule stays: one grouped
cuDNN launch for every client, where a per-client loop would launch a kernel per client and layer
(``python -m benchmarks.conv --device cuda`` measures both; docs/performance.md has the figures)."""
NAMES = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def _pair(value: Pair) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _client_first(t: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    """``t`` with its client dimension first (expanded to ``size`` clients where it has none)."""
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


class PerClientConv2d(torch.autograd.Function):
    """``F.conv2d`` whose vmap rule runs one convolution per client (see the module's docstring)."""

    generate_vmap_rule = False

    @staticmethod
    def forward(x, weight, bias, stride, padding, dilation, groups):  # noqa: ANN001, ANN205 - autograd API
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: ANN001, ANN205
        x, weight, bias, *geometry = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.geometry = geometry

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        wanted = ctx.needs_input_grad
        mask = (wanted[0], wanted[1], ctx.has_bias and wanted[2])
        grads = _PerClientConvGrad.apply(grad_out, x, weight, mask, *ctx.geometry)
        return (*grads, None, None, None, None)

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, stride, padding, dilation, groups):  # noqa: ANN001, ANN205
        x_dim, w_dim, b_dim = in_dims[:3]
        if w_dim is None and b_dim is None:  # shared weights: one convolution over every client's samples
            x = x.movedim(x_dim, 0)
            out = F.conv2d(x.flatten(0, 1), weight, bias, stride, padding, dilation, groups)
            return out.unflatten(0, x.shape[:2]), 0
        size = info.batch_size
        xs, weights = _client_first(x, x_dim, size).unbind(0), _client_first(weight, w_dim, size).unbind(0)
        biases = (None,) * size if bias is None else _client_first(bias, b_dim, size).unbind(0)
        outs = [
            F.conv2d(*client, stride, padding, dilation, groups)
            for client in zip(xs, weights, biases, strict=True)
        ]
        return torch.stack(outs), 0


class _PerClientConvGrad(torch.autograd.Function):
    """The gradients of :class:`PerClientConv2d` (input, weight, bias, as ``mask`` asks); under vmap one
    ``convolution_backward`` per client, the call autograd makes for one client's convolution."""

    generate_vmap_rule = False

    @staticmethod
    def forward(grad_out, x, weight, mask, stride, padding, dilation, groups):  # noqa: ANN001, ANN205
        return _convolution_backward(grad_out, x, weight, mask, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: ANN001, ANN205
        pass

    @staticmethod
    def backward(ctx, *grads):  # noqa: ANN001, ANN205
        raise NotImplementedError("second derivatives of a per-client convolution are not supported")

    @staticmethod
    def vmap(info, in_dims, grad_out, x, weight, mask, stride, padding, dilation, groups):  # noqa: ANN001, ANN205
        size = info.batch_size
        tensors = (grad_out, x, weight)
        clients = zip(
            *(_client_first(t, d, size).unbind(0) for t, d in zip(tensors, in_dims[:3], strict=True)),
            strict=True,
        )
        per_client = [
            _convolution_backward(*client, mask, stride, padding, dilation, groups) for client in clients
        ]
        stacked = tuple(
            torch.stack([grads[i] for grads in per_client]) if wanted else None
            for i, wanted in enumerate(mask)
        )
        return stacked, tuple(None if g is None else 0 for g in stacked)


def _convolution_backward(grad_out, x, weight, mask, stride, padding, dilation, groups):  # noqa: ANN001, ANN202
    """``aten.convolution_backward`` of ``F.conv2d`` for the ``(input, weight, bias)`` grads in ``mask``."""
    return torch.ops.aten.convolution_backward(
        grad_out, x, weight, [weight.shape[0]] if mask[2] else None, stride, padding, dilation, False,
        [0, 0], groups, list(mask),
    )  # fmt: skip


def conv2d_per_client(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``torch.conv2d(*args, **kwargs)`` as :class:`PerClientConv2d`, or None where it stays PyTorch's:
    string padding (``"same"``, ``"valid"``), or an input outside :data:`PER_CLIENT_DEVICES`."""
    bound = dict(zip(NAMES, args, strict=False)) | kwargs
    padding = bound.get("padding", 0)
    if isinstance(padding, str) or bound["input"].device.type not in PER_CLIENT_DEVICES:
        return None
    return PerClientConv2d.apply(
        bound["input"], bound["weight"], bound.get("bias"), _pair(bound.get("stride", 1)), _pair(padding),
        _pair(bound.get("dilation", 1)), bound.get("groups", 1),
    )  # fmt: skip
