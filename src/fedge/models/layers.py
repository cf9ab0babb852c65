"""Building pieces shared by the zoo: named blocks, option types and conv-stack shape tracking."""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated

from pydantic import Field
from torch import nn

from fedge.errors import ConfigError

Probability = Annotated[float, Field(ge=0.0, lt=1.0)]


def block(**layers: nn.Module | None) -> nn.Sequential:
    """A block of named layers in keyword order; ``None`` entries (switched-off layers) are left out."""
    return nn.Sequential(OrderedDict((name, layer) for name, layer in layers.items() if layer is not None))


def maybe_dropout(p: float) -> nn.Dropout | None:
    """A dropout layer, or ``None`` (no layer at all) for ``p == 0``."""
    return nn.Dropout(p) if p > 0 else None


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class FeatureMap:
    """The per-sample ``[C, H, W]`` shape of a conv stack while it is being built.

    Each layer is made through this object, which advances the shape, so flatten sizes follow from any input
    shape, and an image too small for the stack fails at build time with a ``ConfigError`` naming the layer.
    """

    def __init__(self, model: str, input_shape: tuple[int, ...]):
        if len(input_shape) != 3:
            raise ConfigError(
                "model.name", f"{model} needs image input [C, H, W]; got shape {list(input_shape)}"
            )
        self.model = model
        self.input_shape = tuple(input_shape)
        self.channels, self.height, self.width = self.input_shape

    @property
    def numel(self) -> int:
        """Values per sample at this point (the input size of a following flatten + Linear)."""
        return self.channels * self.height * self.width

    def conv(self, out_channels: int, kernel: int, *, padding: int = 0, bias: bool = True) -> nn.Conv2d:
        """A stride-1 square conv from the current channels to ``out_channels``."""
        layer = nn.Conv2d(self.channels, out_channels, kernel, padding=padding, bias=bias)
        self._advance(f"conv{kernel}x{kernel}", kernel, 1, padding)
        self.channels = out_channels
        return layer

    def max_pool(self, kernel: int, *, stride: int | None = None, padding: int = 0) -> nn.MaxPool2d:
        """A square max-pool (stride defaults to the kernel size)."""
        stride = kernel if stride is None else stride
        layer = nn.MaxPool2d(kernel, stride, padding)
        self._advance(f"maxpool{kernel}x{kernel}", kernel, stride, padding)
        return layer

    def pool_fits(self, kernel: int) -> bool:
        """Whether a ``kernel``-sized, same-stride pool leaves at least a 1x1 map."""
        return min(self.height, self.width) >= kernel

    def _advance(self, layer: str, kernel: int, stride: int, padding: int) -> None:
        height = _out_size(self.height, kernel, stride, padding)
        width = _out_size(self.width, kernel, stride, padding)
        if height < 1 or width < 1:
            raise ConfigError(
                "model.name",
                f"input {list(self.input_shape)} is too small for {self.model}: "
                f"a {layer} gets a {self.height}x{self.width} map",
            )
        self.height, self.width = height, width
