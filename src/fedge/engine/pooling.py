"""2 x 2 max pooling with stride 2, the pooling of LeNet-5 and the papers' CNNs, as three maxima.

PyTorch's CPU ``max_pool2d`` scans each window with a data-dependent branch per element and writes a
64-bit index per output. On the stacked activations of a batched step that is slow: LeNet-5's first
pooling over 50 clients x 32 MNIST images (``[1600, 6, 28, 28]``, one thread, 2-core AMD EPYC) takes
31 ms forward on conv outputs, 12 ms for the second. :func:`max_pool_2x2` computes the same output as
the maximum of the window's four strided corners (three vectorised ``maximum`` calls) and the index of
the window's first maximum (the element ``max_pool2d`` keeps on a tie, which is common: a blank
background gives four equal values) from three comparisons; its backward is PyTorch's own
``max_pool2d_with_indices_backward`` on that index. Gradients are bit for bit those of
``F.max_pool2d(x, 2)``, and so are the values, except that a window whose maximum is zero may give
``+0.0`` where PyTorch gives ``-0.0`` (equal values; ``maximum`` does not order the two zeros). Forward
and backward together take 13.6 ms and 4.7 ms on the shapes above, against 33.7 ms and 12.3 ms.

With a NaN in a window the output is NaN as in PyTorch, but the gradient may go to another element of
the window. The batched executor routes its pooling here on the CPU (:mod:`fedge.engine.kernels`);
PyTorch's kernel stays on other devices, and on the sequential executor, where routing every call of a
single-client step through that mode cost more than the pooling saved.
"""

from __future__ import annotations

from typing import Any

import torch

MAXIMA_DEVICES = frozenset({"cpu"})
"""Devices whose 2 x 2 pooling under the batched executor runs as :func:`max_pool_2x2`."""
CORNERS = ((0, 0), (0, 1), (1, 0), (1, 1))  # max_pool2d's scan order within a window
NAMES = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")


def _corners(x: torch.Tensor) -> list[torch.Tensor]:
    """The four strided corners of every 2 x 2 window (an odd last row or column belongs to none)."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    return [x[..., i:h:2, j:w:2] for i, j in CORNERS]


def maxima_and_index(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The maximum of every 2 x 2 window and ``max_pool2d``'s flat index of the window's first maximum
    in its ``H x W`` plane (what ``max_pool2d_with_indices_backward`` takes)."""
    a, b, c, d = _corners(x)
    upper, lower = torch.maximum(a, b), torch.maximum(c, d)
    top = upper >= lower  # the first maximum is in the upper row (a tie goes to the earlier row)
    right = (top & (a < b)) | (~top & (c < d))  # ... and in the right column
    width = x.shape[-1]
    row_starts = torch.arange(a.shape[-2], device=x.device)[:, None] * (2 * width)
    col_starts = torch.arange(a.shape[-1], device=x.device) * 2
    small = torch.uint8 if width < 255 else torch.int64  # the offset within a window: at most width + 1
    offset = (~top).to(small).mul_(width).add_(right)  # in bytes, half the int64 index's passes
    return torch.maximum(upper, lower), row_starts + col_starts + offset


class _MaxPool2x2(torch.autograd.Function):
    """The pooled maximum and, as a second output, ``max_pool2d``'s flat index of each window's first
    maximum in its ``H x W`` plane."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):  # noqa: ANN001, ANN205 - autograd API
        return maxima_and_index(x)

    @staticmethod
    def setup_context(ctx, inputs, output):  # noqa: ANN001, ANN205
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(inputs[0], output[1])

    @staticmethod
    def backward(ctx, grad, _):  # noqa: ANN001, ANN205
        x, index = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, index
        )


def max_pool_2x2(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 2)``: the same values and, bit for bit, the same gradients (see the module's
    docstring); without autograd only the maxima are computed."""
    if not torch.is_grad_enabled():
        a, b, c, d = _corners(x)
        return torch.maximum(torch.maximum(a, b), torch.maximum(c, d))
    return _MaxPool2x2.apply(x)[0]


def _is(value: Any, n: int) -> bool:
    """Whether a pooling argument (an int or a pair) is ``n`` in both dimensions."""
    return value == n or (isinstance(value, (tuple, list)) and len(value) == 2 and all(v == n for v in value))


def max_pool2d_as_maxima(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """``F.max_pool2d(*args, **kwargs)`` by :func:`max_pool_2x2`, or None where it stays PyTorch's:
    anything but a 2 x 2 window with stride 2, no padding, dilation, ceil mode or returned indices, on a
    floating input of :data:`MAXIMA_DEVICES`."""
    bound = dict(zip(NAMES, args, strict=False)) | kwargs
    x = bound["input"]
    return max_pool_2x2(x) if _is_2x2(x, bound) else None


def _is_2x2(x: Any, bound: dict[str, Any]) -> bool:
    stride = bound.get("stride")
    return (
        isinstance(x, torch.Tensor)
        and x.device.type in MAXIMA_DEVICES
        and x.is_floating_point()
        and x.dim() in (3, 4)
        and min(x.shape[-2:]) >= 2
        and _is(bound["kernel_size"], 2)
        and (stride is None or stride == [] or stride == () or _is(stride, 2))
        and _is(bound.get("padding", 0), 0)
        and _is(bound.get("dilation", 1), 1)
        and not bound.get("ceil_mode", False)
        and not bound.get("return_indices", False)
    )
