"""The splittable model: an ordered stack of named blocks, cut into a client part and a server part."""

from __future__ import annotations

import itertools
from collections import OrderedDict

import torch
from torch import nn
from torch.func import functional_call

from fedge.errors import ConfigError


class SplitModel(nn.Sequential):
    """An ``nn.Sequential`` of named blocks that can be cut between any two blocks.

    ``name`` is the zoo name used in messages; ``default_cut`` is the cut the model's paper uses (the number
    of blocks on the client side), or ``None`` where no paper defines one. ``pad_id`` is the input id a
    model masks as padding (a transformer reading right-padded token sequences, whose pad positions cross
    the cut as zero vectors and are never sent); ``None`` for a model that reads no padding.
    """

    pad_id: int | None = None

    def __init__(
        self, blocks: OrderedDict[str, nn.Module], *, name: str = "model", default_cut: int | None = None
    ):
        super().__init__(blocks)
        self.name = name
        self.default_cut = default_cut
        if default_cut is not None and default_cut not in self.cut_points:
            raise ValueError(f"default_cut {default_cut} of {name} is not one of its cut points")

    @property
    def block_names(self) -> list[str]:
        """The blocks' names, in forward order."""
        return list(self._modules)

    @property
    def cut_points(self) -> list[int]:
        """Valid cuts: the number of blocks on the client side, each side keeping at least one block."""
        return list(range(1, len(self)))


def split(model: SplitModel, cut: int) -> tuple[nn.Sequential, nn.Sequential]:
    """The client part (the first ``cut`` blocks) and the server part (the rest).

    Both parts hold the model's own block objects under the same names (no copy), so ``server(client(x))``
    is exactly ``model(x)`` and training either part trains the model.
    """
    if cut not in model.cut_points:
        raise ConfigError("model.cut", f"got {cut!r}; valid cuts are 1..{len(model) - 1} for {model.name}")
    items = list(model.named_children())
    return nn.Sequential(OrderedDict(items[:cut])), nn.Sequential(OrderedDict(items[cut:]))


def count_parameters(module: nn.Module) -> int:
    """Number of scalar parameters (buffers such as BatchNorm running statistics excluded)."""
    return sum(p.numel() for p in module.parameters())


def output_shape(module: nn.Module, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Per-sample output shape of ``module`` for a per-sample ``input_shape`` (e.g. the smashed data).

    Runs on the meta device, so it computes nothing, draws no random numbers and leaves buffers untouched.
    """
    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    meta = {name: torch.empty_like(tensor, device="meta") for name, tensor in tensors}
    sample = torch.empty((2, *input_shape), device="meta")
    return tuple(functional_call(module, meta, (sample,)).shape[1:])
