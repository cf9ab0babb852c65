"""Which layer a feature proxy is: the featurizer's output layer, and whether it is one linear layer.

A gradient proxy restricted to one ``nn.Linear`` layer fed one row per sample admits the fast cosine of
:meth:`~fedge.algorithms.decentralized.proxies.Prober.similarities` (no per-pair gradient formed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedge.errors import ConfigError
from fedge.models import SplitModel, split


def proxy_layer(model: SplitModel, override: str | None) -> list[str]:
    """Parameter names of the feature-proxy layer (AFIND+ Sec. 3.2's "output layer of the featurizer").

    Default: the last ``Linear``/``Conv2d`` before the head block (the featurizer's output layer: ``fc1``
    of the MLP and ``cnn4``, ``conv2`` of ``cnn2``, ``layer4.1.conv2`` of ResNet-18), or the head's own
    layer for a one-block model. ``override`` names any submodule; all its parameters form the proxy.
    """
    if override is not None:
        try:
            module = model.get_submodule(override)
        except AttributeError:
            raise ConfigError(
                "algorithm.proxy_layer", f"{model.name} has no submodule {override!r}"
            ) from None
        names = [f"{override}.{n}" for n, _ in module.named_parameters()]
        if not names:
            raise ConfigError("algorithm.proxy_layer", f"{override!r} has no parameters")
        return names
    featurizer = split(model, len(model) - 1)[0] if len(model) > 1 else model
    layers = [n for n, m in featurizer.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    return [f"{layers[-1]}.{n}" for n, _ in model.get_submodule(layers[-1]).named_parameters()]


@dataclass(frozen=True)
class LinearProxy:
    """A proxy that is exactly one ``nn.Linear`` layer's weight (and bias), in that order."""

    name: str
    in_features: int
    out_features: int
    bias: bool

    @property
    def weight_size(self) -> int:
        return self.in_features * self.out_features


def linear_proxy(
    model: nn.Module, proxy_names: Sequence[str], input_shape: tuple[int, ...]
) -> LinearProxy | None:
    """The linear layer whose parameters ``proxy_names`` are, if they are one and it takes one row per
    sample (``[batch, in_features]``, checked on one zero sample); else None."""
    layer_name = proxy_names[0].rpartition(".")[0]
    layer = model.get_submodule(layer_name)
    if not isinstance(layer, nn.Linear):
        return None
    own = [f"{layer_name}.{n}" for n, _ in layer.named_parameters()]
    if list(proxy_names) != own or own[0] != f"{layer_name}.weight":
        return None
    dims: list[int] = []
    handle = layer.register_forward_hook(lambda module, inputs, output: dims.append(inputs[0].dim()))
    was_training = model.training
    model.eval()  # no BatchNorm statistics move
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, device=layer.weight.device))
    finally:
        handle.remove()
        model.train(was_training)
    if dims != [2]:
        return None
    return LinearProxy(layer_name, layer.in_features, layer.out_features, layer.bias is not None)
