"""A model the user brings: any ``nn.Module``, made splittable when it is a stack of named blocks.

``fedge.run(config, model=...)`` accepts any module. Full-model algorithms (FedAvg, the decentralized and
hierarchical families) only call it through ``functional_call``, so any module works. The split family
cuts it between two blocks: the module must be an ``nn.Sequential`` (its children are the blocks, in
order) and says where to cut with a ``cut`` attribute, the number of blocks on the client side (as
``model.cut`` in a config) or the name of the last client-side block.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable

from torch import nn

from fedge.errors import ConfigError
from fedge.models.base import SplitModel

CUSTOM = "custom"  # the model name a run with a user's module reports


def block_cut(model: nn.Module, cut: int | str | None) -> int | None:
    """The number of client-side blocks that ``cut`` (a count, or a block name) means for ``model``."""
    if cut is None:
        return None
    if not isinstance(model, nn.Sequential):
        raise ConfigError("model.cut", f"a cut needs an nn.Sequential of blocks; got {type(model).__name__}")
    names = list(model._modules)
    if isinstance(cut, str):
        if cut not in names:
            raise ConfigError("model.cut", f"names no block {cut!r}; blocks: {', '.join(names)}")
        cut = names.index(cut) + 1
    if isinstance(cut, bool) or not isinstance(cut, int) or not 1 <= cut < len(names):
        raise ConfigError("model.cut", f"got {cut!r}; a cut keeps a block on each side: 1..{len(names) - 1}")
    return cut


def as_split_model(module: nn.Module) -> nn.Module:
    """``module`` as fedge uses it: a :class:`SplitModel` over the same blocks for an ``nn.Sequential``
    (its ``cut`` attribute, if any, becomes the default cut), the module itself otherwise."""
    if isinstance(module, SplitModel):
        return module
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters()):
        raise ConfigError(
            "model", "has lazy (uninitialised) parameters; call it once on a sample batch first"
        )
    cut = block_cut(module, getattr(module, "cut", None))
    if not isinstance(module, nn.Sequential):
        return module
    return SplitModel(OrderedDict(module.named_children()), name=CUSTOM, default_cut=cut)


def user_factory(module: nn.Module) -> Callable[[], nn.Module]:
    """A builder of fresh copies of the user's module, each starting from the weights it has now."""
    template = as_split_model(module)

    def build() -> nn.Module:
        return copy.deepcopy(template)

    return build
