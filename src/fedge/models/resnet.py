"""CIFAR ResNet-18 (3x3 stem, no max-pool), as AFIND+ uses for CIFAR-100."""

from __future__ import annotations

from collections import OrderedDict

from pydantic import PositiveInt
from torch import Tensor, nn

from fedge.models.base import SplitModel
from fedge.models.layers import FeatureMap, block


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection (1x1 conv-BN shortcut when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def build_resnet18(input_shape: tuple[int, ...], num_classes: int, *, width: PositiveInt = 64) -> SplitModel:
    """CIFAR ResNet-18: 3x3 stem, four stages of two BasicBlocks (width, 2x, 4x, 8x), global pool, Linear.

    Each residual stage is one block (``stem, layer1..layer4, out``: cuts 1..5), which keeps the familiar
    parameter names (``layer4.1.conv2``, AFIND+'s proxy layer) and cuts only between stages. Works on any
    image size (strided 3x3 convs with padding never go below 1x1; the pool is adaptive).
    """
    fm = FeatureMap("resnet18", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    stem = fm.conv(width, 3, padding=1, bias=False)
    blocks["stem"] = block(conv=stem, bn=nn.BatchNorm2d(width), relu=nn.ReLU())
    channels = width
    for stage in range(4):
        out_channels = width * 2**stage
        stride = 1 if stage == 0 else 2
        first = BasicBlock(channels, out_channels, stride)
        blocks[f"layer{stage + 1}"] = nn.Sequential(first, BasicBlock(out_channels, out_channels, 1))
        channels = out_channels
    pool = nn.AdaptiveAvgPool2d(1)
    blocks["out"] = block(pool=pool, flatten=nn.Flatten(), linear=nn.Linear(channels, num_classes))
    return SplitModel(blocks, name="resnet18")
