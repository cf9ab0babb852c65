"""The two split models of CSE-FSL (Mu & Shen), as CSE-FSL Sec. VI-A and Tables III-IV describe them."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedge.models.base import SplitModel
from fedge.models.layers import FeatureMap, block


def _lrn() -> nn.LocalResponseNorm:
    """LRN with the settings of the paper's code: size 4, alpha 0.001/9, beta 0.75, k 1."""
    return nn.LocalResponseNorm(4, alpha=0.001 / 9.0, beta=0.75, k=1.0)


def build_cse_cifar(input_shape: tuple[int, ...], num_classes: int) -> SplitModel:
    """CSE-FSL's CIFAR-10 model (TF tutorial CNN) on 3x24x24 crops: client 107,328 + server 960,970 params.

    Client: conv5 64 + ReLU, 3x3/2 max-pool, LRN; conv5 64 + ReLU, LRN, 3x3/2 max-pool (the code's order and
    pool window) -> 64x6x6 smashed data. Server: FC 384, FC 192, FC to the classes. Default cut: 2.
    """
    fm = FeatureMap("cse_cifar", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    conv = fm.conv(64, 5, padding=2)
    blocks["conv1"] = block(conv=conv, relu=nn.ReLU(), pool=fm.max_pool(3, stride=2, padding=1), lrn=_lrn())
    conv = fm.conv(64, 5, padding=2)
    blocks["conv2"] = block(conv=conv, relu=nn.ReLU(), lrn=_lrn(), pool=fm.max_pool(3, stride=2, padding=1))
    blocks["fc1"] = block(flatten=nn.Flatten(), linear=nn.Linear(fm.numel, 384), relu=nn.ReLU())
    blocks["fc2"] = block(linear=nn.Linear(384, 192), relu=nn.ReLU())
    blocks["out"] = block(linear=nn.Linear(192, num_classes))
    return SplitModel(blocks, name="cse_cifar", default_cut=2)


def build_cse_femnist(
    input_shape: tuple[int, ...], num_classes: int, *, dropout: bool = True, conv_relu: bool = True
) -> SplitModel:
    """CSE-FSL's F-EMNIST model (Reddi et al.'s CNN) on 1x28x28: client 18,816 + server 1,187,774 params.

    Client: conv3 32, conv3 64, 2x2 max-pool, Dropout(0.25) -> unflattened 64x12x12 smashed data (so a
    1x1-conv aux head can read it). Server: flatten, FC 128 + ReLU, Dropout(0.5), FC to the classes.
    Default cut: 2. The paper's code has no ReLU after the convs; as in Reddi et al.'s model, which the
    paper cites, ``conv_relu`` puts one after each (default on; counts unchanged; docs/decisions.md, "ReLU
    after the F-EMNIST convolutions"). ``dropout`` switches both dropout layers.
    """
    fm = FeatureMap("cse_femnist", input_shape)
    blocks: OrderedDict[str, nn.Module] = OrderedDict()
    blocks["conv1"] = block(conv=fm.conv(32, 3), relu=nn.ReLU() if conv_relu else None)
    conv = fm.conv(64, 3)
    blocks["conv2"] = block(
        conv=conv,
        relu=nn.ReLU() if conv_relu else None,
        pool=fm.max_pool(2),
        dropout=nn.Dropout(0.25) if dropout else None,
    )
    blocks["fc1"] = block(
        flatten=nn.Flatten(),
        linear=nn.Linear(fm.numel, 128),
        relu=nn.ReLU(),
        dropout=nn.Dropout(0.5) if dropout else None,
    )
    blocks["out"] = block(linear=nn.Linear(128, num_classes))
    return SplitModel(blocks, name="cse_femnist", default_cut=2)
