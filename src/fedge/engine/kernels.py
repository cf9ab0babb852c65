"""The batched executor's own CPU kernels for convolutional models, switched on around its vmapped steps.

``with batched_kernels():`` routes, within the block, every ``conv2d`` through
:class:`~fedge.engine.convolution.PerClientConv2d` (one convolution per client instead of PyTorch's
grouped rule under ``vmap``) and every 2 x 2 max pooling through
:func:`~fedge.engine.pooling.max_pool_2x2` (three maxima instead of PyTorch's branching scan). Both give
the numbers of PyTorch's kernels on one client (bit for bit, but for the sign of a pooled zero), so the
batched executor still agrees with the sequential one; both apply on the CPU only, and any other call
runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from fedge.engine.convolution import conv2d_per_client
from fedge.engine.pooling import max_pool2d_as_maxima

_ROUTES: dict[Callable[..., Any], Callable[[tuple[Any, ...], dict[str, Any]], torch.Tensor | None]] = {
    torch.conv2d: conv2d_per_client,
    F.max_pool2d: max_pool2d_as_maxima,
}


class batched_kernels(TorchFunctionMode):  # noqa: N801 - used like a function: ``with batched_kernels():``
    """Within this context, ``conv2d`` and ``max_pool2d`` calls run as fedge's kernels where they apply."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        out = None if route is None else route(args, kwargs)
        return func(*args, **kwargs) if out is None else out
