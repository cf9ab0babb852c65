"""Named tensors, the currency of every layer: a model's state, a payload, a stacked client group.

``Tensors`` maps names (as in ``module.state_dict()``) to tensors; a *stacked* ``Tensors`` has a leading
row per client. The helpers here are the few operations every layer needs on them.
"""

from __future__ import annotations

from typing import Any

import torch

Tensors = dict[str, torch.Tensor]


def floating(tensors: Tensors) -> Tensors:
    """The floating-point entries: what travels and is averaged of a state (integer counters such as
    BatchNorm's ``num_batches_tracked`` stay with their holder)."""
    return {name: t for name, t in tensors.items() if t.is_floating_point()}


def rows(tensors: Tensors, index: torch.Tensor | slice | int) -> Tensors:
    """The rows ``index`` of stacked tensors (a view for a slice or an int, a copy for an index tensor)."""
    return {name: t[index] for name, t in tensors.items()}


def on_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside it (nested dicts, lists, tuples) moved to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: on_device(item, device) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(on_device(item, device) for item in value)
    return value
