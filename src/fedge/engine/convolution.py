"""First-layer 2-d convolution as one matrix product per client, for training many clients under vmap.

Under ``torch.func.vmap`` with per-client weights, ``conv2d`` becomes one grouped convolution with a
group per client. On CPU the weight gradient of that grouped convolution, for a first layer (few input
channels, a large image), is both a little slower than the same arithmetic as matrix products and far
more fragile when other processes compete for the cores: measured on 2 cores for LeNet-5's first layer
(100 clients x 32 MNIST images, forward and weight gradient), 0.071 s grouped against 0.062 s as below
on an idle machine, but 3.3 s against 0.30 s while other jobs kept the machine loaded; a whole W2
FedAvg round went from 3.6 s to 3.1 s idle, and from about 80 s to 25 s under that load.

:func:`conv_as_matmul` rewrites those calls as patches (a strided view of the input, laid out once as
a ``[C_in * kh * kw, N * positions]`` matrix) times the weight matrix, which vmap turns into one
batched matrix product over clients, each client's product a single large GEMM. Only convolutions
whose input needs no gradient (the data entering the first layer) are rewritten: for later layers the
grouped convolution was the fastest of those measured (``F.unfold``, whose CPU kernel loops over
samples; strided patches, whose backward has no batching rule; an index gather). Same arithmetic,
different summation order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

Pair = int | tuple[int, int]


def _pair(value: Pair) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def conv2d_unfolded(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: Pair = 1,
    padding: Pair = 0,
) -> torch.Tensor:
    """``F.conv2d`` (one group, no dilation, numeric padding) of a ``[N, C, H, W]`` batch as one GEMM.

    The patches are a strided view of the (padded) input; one copy lays them out as a
    ``[C_in * kh * kw, N * positions]`` matrix, so each client's convolution is a single large product.
    """
    n = x.shape[0]
    out_channels, in_channels, kh, kw = weight.shape
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    patches = x.unfold(2, kh, sh).unfold(3, kw, sw)  # [N, C_in, out_h, out_w, kh, kw], a view
    out_h, out_w = patches.shape[2], patches.shape[3]
    columns = patches.permute(1, 4, 5, 0, 2, 3).reshape(in_channels * kh * kw, n * out_h * out_w)
    out = weight.reshape(out_channels, -1) @ columns  # [C_out, N * positions]
    if bias is not None:
        out = out + bias.reshape(out_channels, 1)
    return out.reshape(out_channels, n, out_h, out_w).transpose(0, 1)


NAMES = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def _unfolded_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments of :func:`conv2d_unfolded` for a ``conv2d`` call it covers, else None.

    Covered: a batched ``[N, C, H, W]`` input that needs no gradient (the data, into the first layer),
    one group, no dilation, numeric padding.
    """
    bound = dict(zip(NAMES, args, strict=False)) | kwargs
    x, padding, dilation = bound["input"], bound.get("padding", 0), bound.get("dilation", 1)
    if x.dim() != 4 or x.requires_grad or bound.get("groups", 1) != 1 or isinstance(padding, str):
        return None
    if _pair(dilation) != (1, 1):
        return None
    return {k: bound[k] for k in ("input", "weight", "bias", "stride", "padding") if k in bound}


class conv_as_matmul(TorchFunctionMode):  # noqa: N801 - used like a function: ``with conv_as_matmul():``
    """Within this context, ``torch.conv2d`` / ``F.conv2d`` calls run as :func:`conv2d_unfolded`.

    Calls it does not cover (groups, dilation, string padding, unbatched input) run unchanged.
    """

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        covered = _unfolded_arguments(args, kwargs) if func is torch.conv2d else None
        if covered is None:
            return func(*args, **kwargs)
        return conv2d_unfolded(covered.pop("input"), **covered)
