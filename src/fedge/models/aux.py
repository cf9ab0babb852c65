"""Client-side auxiliary heads for split learning with a local loss (CSE-FSL, FSL_AN)."""

from __future__ import annotations

import math

from torch import nn

from fedge.errors import ConfigError
from fedge.models.layers import block

SETTINGS = {"linear": (), "mlp": ("hidden",), "cnn_mlp": ("channels",)}


def aux_head(
    kind: str,
    in_shape: tuple[int, ...],
    num_classes: int,
    channels: int | None = None,
    hidden: int | None = None,
) -> nn.Module:
    """An auxiliary head mapping the client's per-sample output of shape ``in_shape`` to class logits.

    - ``linear``: flatten + one Linear (what CSE-FSL calls the "MLP" aux; 23,050 params for 64x6x6 -> 10);
    - ``mlp``: flatten, Linear to ``hidden``, ReLU, Linear;
    - ``cnn_mlp``: 1x1 conv (+bias) to ``channels``, ReLU (our choice: the paper names no activation),
      flatten, Linear; needs a ``[C, H, W]`` client output (CSE-FSL Tables III/IV: 425k+10 and 8993k+62
      params).

    Each kind takes exactly its own settings; a missing or superfluous one names its ``model.aux`` key.
    """
    if kind not in SETTINGS:
        raise ConfigError("model.aux.kind", f"unknown aux head {kind!r}; known: {', '.join(SETTINGS)}")
    for key, value in (("channels", channels), ("hidden", hidden)):
        if key in SETTINGS[kind] and value is None:
            raise ConfigError(f"model.aux.{key}", f"required by the {kind} aux head")
        if key not in SETTINGS[kind] and value is not None:
            raise ConfigError(f"model.aux.{key}", f"not used by the {kind} aux head")
    features = math.prod(in_shape)
    if kind == "linear":
        return block(flatten=nn.Flatten(), linear=nn.Linear(features, num_classes))
    if kind == "mlp":
        return block(
            flatten=nn.Flatten(),
            hidden=nn.Linear(features, hidden),
            relu=nn.ReLU(),
            linear=nn.Linear(hidden, num_classes),
        )
    if len(in_shape) != 3:
        raise ConfigError("model.aux.kind", f"cnn_mlp needs a [C, H, W] client output; got {list(in_shape)}")
    in_channels, height, width = in_shape
    return block(
        conv=nn.Conv2d(in_channels, channels, 1),
        relu=nn.ReLU(),
        flatten=nn.Flatten(),
        linear=nn.Linear(channels * height * width, num_classes),
    )
