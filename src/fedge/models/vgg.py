"""CIFAR-style VGG (Light-FedSL's VGG-19-BN), one block per conv so the cut counts conv layers."""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

from pydantic import PositiveFloat
from torch import nn

from fedge.models.base import SplitModel
from fedge.models.layers import FeatureMap, block

STAGE_CHANNELS = (64, 128, 256, 512, 512)
CONVS_PER_STAGE = {11: (1, 1, 2, 2, 2), 13: (2, 2, 2, 2, 2), 16: (2, 2, 3, 3, 3), 19: (2, 2, 4, 4, 4)}


def build_vgg(
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    depth: Literal[11, 13, 16, 19] = 19,
    batch_norm: bool = True,
    width: PositiveFloat = 1.0,
) -> SplitModel:
    """CIFAR VGG-11/13/16/19 (3x3 convs, BatchNorm, ReLU, five 2x2 max-pools) and one Linear; default cut 8.

    Blocks ``conv1..convN`` hold conv(+BN)+ReLU, and the max-pool ending a stage goes into the block of the
    stage's last conv (our reading of lightweight FedSL's "layers 1..Lc"; docs/decisions.md,
    "VGG-19 and where its cuts fall"), so cuts 4, 8, 12 of VGG-19 are the ends of stages 2, 3, 4
    (8192, 4096, 2048 values per sample on 3x32x32). ``width`` scales every conv's channels (at least 1) for
    CPU-sized "mini-VGGs". A pool that would shrink a map below 1x1 (inputs under 32x32) is left out. Convs
    carry a bias only without BatchNorm, where it is not redundant.
    """
    fm = FeatureMap(f"vgg{depth}", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    for channels, convs in zip(STAGE_CHANNELS, CONVS_PER_STAGE[depth], strict=True):
        for i in range(convs):
            conv = fm.conv(max(1, round(channels * width)), 3, padding=1, bias=not batch_norm)
            norm = nn.BatchNorm2d(fm.channels) if batch_norm else None
            pool = fm.max_pool(2) if i == convs - 1 and fm.pool_fits(2) else None
            blocks[f"conv{len(blocks) + 1}"] = block(conv=conv, bn=norm, relu=nn.ReLU(), pool=pool)
    blocks["out"] = block(flatten=nn.Flatten(), linear=nn.Linear(fm.numel, num_classes))
    return SplitModel(blocks, name=f"vgg{depth}", default_cut=8)
