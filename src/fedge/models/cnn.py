"""Small plain CNNs: LeNet-5 and the CIFAR-10 CNN (HIST), AFIND+'s two-layer and four-layer CNNs.

Every conv is followed by ReLU and a 2x2 max-pool (unpadded, except the CIFAR CNN's 3x3 convs with padding
1); flatten sizes follow from the input shape. The ReLU is applied after the pool: an unpadded max-pool
commutes with ReLU, values and gradients alike, and the ReLU then runs on a quarter of the values.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedge.models.base import SplitModel
from fedge.models.layers import FeatureMap, Probability, block, maybe_dropout


def _conv_pool(fm: FeatureMap, channels: int, kernel: int, padding: int = 0) -> nn.Sequential:
    """Conv (valid unless ``padding``), ReLU, 2x2 max-pool, computed as conv, pool, ReLU.

    ``relu(maxpool(x)) == maxpool(relu(x))`` exactly (the maximum of a window is positive exactly when
    ReLU keeps it), and so are the gradients: both send a window's gradient to its largest input when
    that input is positive, and nothing otherwise. Pooling first makes the ReLU and its gradient four
    times cheaper (a conv block's ReLU was about a tenth of a LeNet-5 round).
    """
    return block(conv=fm.conv(channels, kernel, padding=padding), pool=fm.max_pool(2), relu=nn.ReLU())


def build_lenet5(input_shape: tuple[int, ...], num_classes: int, *, dropout: Probability = 0.0) -> SplitModel:
    """LeNet-5 of HIST: conv5 6, conv5 16, FC 120, 84 (44,426 parameters on 1x28x28, 10 classes).

    The count holds for the unpadded 28x28 input (256-value flatten): HIST's 0.169 MB model, while the
    paper's 2,572 / 59,134 conv/FC split needs a 400-value flatten (docs/decisions.md, "LeNet-5's size").
    HIST's code uses Dropout(0.3) after fc1 and fc2; ``dropout`` turns it on (off by default).
    """
    fm = FeatureMap("lenet5", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    blocks["conv1"] = _conv_pool(fm, 6, 5)
    blocks["conv2"] = _conv_pool(fm, 16, 5)
    linear = nn.Linear(fm.numel, 120)
    blocks["fc1"] = block(flatten=nn.Flatten(), linear=linear, relu=nn.ReLU(), dropout=maybe_dropout(dropout))
    blocks["fc2"] = block(linear=nn.Linear(120, 84), relu=nn.ReLU(), dropout=maybe_dropout(dropout))
    blocks["out"] = block(linear=nn.Linear(84, num_classes))
    return SplitModel(blocks, name="lenet5")


def build_cnn2(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """AFIND+'s FashionMNIST two-layer CNN: conv5 32, conv5 64, Linear (1024 inputs on 1x28x28).

    AFIND+ (App. C.3) names the model only; we use conv-pool blocks with the usual ReLU after each conv.
    """
    fm = FeatureMap("cnn2", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    blocks["conv1"] = _conv_pool(fm, 32, 5)
    blocks["conv2"] = _conv_pool(fm, 64, 5)
    blocks["out"] = block(flatten=nn.Flatten(), linear=nn.Linear(fm.numel, num_classes))
    return SplitModel(blocks, name="cnn2")


def build_cnn4(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """AFIND+'s CIFAR-10 / FEMNIST four-layer CNN: conv5 32, conv5 64, FC 512, Linear.

    ``fc1`` (1600 inputs on 3x32x32, 1024 on 1x28x28) is AFIND+'s feature-proxy layer, ``out`` its head.
    """
    fm = FeatureMap("cnn4", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    blocks["conv1"] = _conv_pool(fm, 32, 5)
    blocks["conv2"] = _conv_pool(fm, 64, 5)
    blocks["fc1"] = block(flatten=nn.Flatten(), linear=nn.Linear(fm.numel, 512), relu=nn.ReLU())
    blocks["out"] = block(linear=nn.Linear(512, num_classes))
    return SplitModel(blocks, name="cnn4")


def build_cifar_cnn(
    input_shape: tuple[int, ...], num_classes: int, *, dropout: Probability = 0.3
) -> SplitModel:
    """HIST's CIFAR-10 CNN (Table II): conv3 16, 32, 64 (pad 1), FC 500 (541,094 parameters on 3x32x32).

    Each conv block is conv 3x3 with padding 1, ReLU, 2x2 max-pool; then flatten (1,024 values on 32x32),
    Dropout, Linear 500, ReLU, Dropout, Linear. Its one hidden FC layer (500 neurons) is what HIST
    partitions across cells; the convs are shared. ``dropout`` is the authors' 0.3 (0 turns it off).
    """
    fm = FeatureMap("cifar_cnn", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    for index, channels in enumerate((16, 32, 64), start=1):
        blocks[f"conv{index}"] = _conv_pool(fm, channels, 3, padding=1)
    blocks["fc1"] = block(
        flatten=nn.Flatten(),
        dropout_in=maybe_dropout(dropout),
        linear=nn.Linear(fm.numel, 500),
        relu=nn.ReLU(),
        dropout=maybe_dropout(dropout),
    )
    blocks["out"] = block(linear=nn.Linear(500, num_classes))
    return SplitModel(blocks, name="cifar_cnn")
