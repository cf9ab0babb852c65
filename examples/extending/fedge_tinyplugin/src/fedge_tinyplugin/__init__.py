"""A separate package that adds a model and a dataset to fedge through entry points."""

import numpy as np
from torch import nn


def build_tiny_cnn(input_shape, num_classes, *, channels: int = 4) -> nn.Sequential:
    """A two-block CNN: conv (``channels`` maps) then a linear classifier; cut after ``conv``."""
    model = nn.Sequential()
    model.add_module("conv", nn.Sequential(nn.Conv2d(input_shape[0], channels, 3, padding=1), nn.ReLU()))
    model.add_module(
        "head",
        nn.Sequential(nn.Flatten(), nn.Linear(channels * input_shape[1] * input_shape[2], num_classes)),
    )
    model.cut = "conv"
    return model


def load_stripes(cfg, seed):
    """Images with a bright horizontal stripe whose row is the class (data.num_classes of them)."""
    rng = np.random.default_rng(seed)
    classes = cfg.num_classes

    def draw(n):
        labels = rng.integers(0, classes, n)
        images = rng.normal(0.0, 0.5, size=(n, 1, classes, 8)).astype(np.float32)
        images[np.arange(n), 0, labels, :] += 2.0
        return images, labels

    return draw(cfg.num_train), draw(cfg.num_test)
