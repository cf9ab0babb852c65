"""Fully connected models: a configurable MLP and HIST's FCNN 784-300-10."""

from __future__ import annotations

import math
from collections import OrderedDict

from pydantic import PositiveInt
from torch import nn

from fedge.models.base import SplitModel
from fedge.models.layers import Probability, block, maybe_dropout


def _dense(
    name: str, input_shape: tuple[int, ...], widths: tuple[int, ...], num_classes: int, p: float
) -> SplitModel:
    """Blocks ``fc1..fcK`` (Linear, ReLU, optional dropout) and ``out``; the first block flattens."""
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    features = math.prod(input_shape)
    for i, width in enumerate(widths, start=1):
        flatten = nn.Flatten() if i == 1 else None
        linear = nn.Linear(features, width)
        blocks[f"fc{i}"] = block(flatten=flatten, linear=linear, relu=nn.ReLU(), dropout=maybe_dropout(p))
        features = width
    flatten = nn.Flatten() if not widths else None
    blocks["out"] = block(flatten=flatten, linear=nn.Linear(features, num_classes))
    return SplitModel(blocks, name=name)


def build_mlp(
    input_shape: tuple[int, ...], num_classes: int, *, hidden: tuple[PositiveInt, ...] = (200,)
) -> SplitModel:
    """MLP with ReLU hidden layers of the given widths (no hidden layer: logistic regression, no cut)."""
    return _dense("mlp", input_shape, tuple(hidden), num_classes, 0.0)


def build_fcnn(input_shape: tuple[int, ...], num_classes: int, *, dropout: Probability = 0.0) -> SplitModel:
    """HIST's FCNN: flatten, Linear 300, ReLU, Linear to the classes (238,510 parameters on 1x28x28).

    HIST's code adds Dropout(0.5) after the hidden layer; ``dropout`` turns it on (off by default).
    """
    return _dense("fcnn", input_shape, (300,), num_classes, dropout)
