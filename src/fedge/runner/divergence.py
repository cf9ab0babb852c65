"""Divergence: the first NaN or infinite number in a round's metrics or in an algorithm's state.

The runner asks after every round; with ``stop.on_nonfinite: error`` the answer stops the run before the
round's row or checkpoint is written, so the last checkpoint is always a finite one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

IGNORED_METRICS = ("wall_seconds",)


def _bad_number(value: Any) -> float | None:
    """The first non-finite float in a metric value (a number, or lists / dicts of numbers)."""
    if isinstance(value, float | np.floating):
        return None if math.isfinite(value) else float(value)
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            bad = _bad_number(item)
            if bad is not None:
                return bad
    return None


def nonfinite_metric(metrics: Mapping[str, Any]) -> str | None:
    """``"<key> = <value>"`` for the first non-finite metric, else ``None``."""
    for key, value in metrics.items():
        ignored = key in IGNORED_METRICS or key.startswith("epsilon")  # an unbounded epsilon: not DP
        bad = None if ignored else _bad_number(value)
        if bad is not None:
            return f"{key} = {bad}"
    return None


def _bad_entry(values: torch.Tensor | np.ndarray) -> float | None:
    """The first non-finite entry of a floating tensor or array, else ``None`` (integers are finite)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind != "f" or np.isfinite(values).all():
            return None
        return float(values[~np.isfinite(values)].flat[0])
    if not values.is_floating_point() or bool(torch.isfinite(values).all()):
        return None
    return float(values[~torch.isfinite(values)].reshape(-1)[0])


def nonfinite_state(state: Any, path: str = "state") -> str | None:
    """``"<path> holds <value>"`` for the first tensor, array or float of ``state`` that is not finite."""
    if isinstance(state, torch.Tensor | np.ndarray):
        bad = _bad_entry(state)
        return None if bad is None else f"{path} holds {bad}"
    if isinstance(state, float):
        return None if math.isfinite(state) else f"{path} = {state}"
    items: Any = ()
    if isinstance(state, Mapping):
        items = state.items()
    elif isinstance(state, list | tuple):
        items = enumerate(state)
    for key, value in items:
        found = nonfinite_state(value, f"{path}.{key}")
        if found is not None:
            return found
    return None
