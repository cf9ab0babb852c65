"""The in-memory dataset every source produces: tensors held once, shared by all clients."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORED_TARGET = -100
"""The target of a language model's pad position (``data.sequences: lines``): PyTorch's cross-entropy
default ``ignore_index``, so no loss, gradient or count reads it."""


@dataclass(frozen=True)
class Dataset:
    """Train and test tensors of one dataset.

    ``x_*`` are float32 tensors of shape ``[N, *input_shape]`` (images as ``[N, C, H, W]``), already
    scaled and normalised; ``y_*`` are int64 class labels. ``train_groups`` / ``test_groups`` hold a
    natural group id per sample (the FEMNIST writer) or ``None`` where the dataset has no such groups.
    ``pad_id`` is the token id right-padded sequences are filled with (``None``: no sample is padded); a
    language model's targets at those positions are :data:`IGNORED_TARGET`.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    train_groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None
    pad_id: int | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample."""
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.y_test.shape[0])
