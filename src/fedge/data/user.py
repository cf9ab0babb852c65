"""Data the user brings: a ``torch.utils.data.Dataset`` or an ``(X, y)`` pair of tensors or arrays.

``fedge.run(config, train=..., test=...)`` turns them into the :class:`~fedge.data.dataset.Dataset`
every source produces, so the partitioners split them exactly as they split built-in data. Features
become float32 as given (no normalisation: the user's data is taken as the user prepared it); labels must
be whole numbers from 0. Without ``test``, a seeded ``data.test_fraction`` of ``train`` is held out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedge.data.dataset import Dataset
from fedge.errors import DataError
from fedge.rng import numpy_rng

UserData = Any  # a torch Dataset, or (X, y) as tensors or numpy arrays


def _pair(data: UserData, which: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels of one split, as float32 and int64 tensors."""
    if isinstance(data, tuple | list) and len(data) == 2:
        x, y = data
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        items = [data[i] for i in range(len(data))]
        if not items:
            raise DataError(f"{which}: the dataset is empty")
        x = torch.stack([torch.as_tensor(item[0]) for item in items])
        y = torch.as_tensor([int(item[1]) for item in items])
    else:
        raise DataError(f"{which}: expected a torch Dataset or an (X, y) pair; got {type(data).__name__}")
    x, y = torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x), torch.as_tensor(y)
    if x.shape[0] != y.shape[0] or y.dim() != 1:
        raise DataError(
            f"{which}: X has {x.shape[0]} rows but y has shape {list(y.shape)}; need one label a row"
        )
    if y.is_floating_point() and not torch.equal(y, y.round()):
        raise DataError(f"{which}: labels must be class indices (whole numbers)")
    y = y.long()
    if len(y) and int(y.min()) < 0:
        raise DataError(f"{which}: labels must be class indices from 0; got {int(y.min())}")
    return x.float().contiguous(), y


def user_dataset(train: UserData, test: UserData | None, seed: int, test_fraction: float) -> Dataset:
    """The user's train (and test) data as a :class:`Dataset` named ``custom``."""
    x_train, y_train = _pair(train, "train")
    if test is None:
        order = numpy_rng(seed, "custom-test").permutation(len(y_train))
        held = max(1, round(test_fraction * len(y_train)))
        keep, out = torch.as_tensor(np.sort(order[held:])), torch.as_tensor(np.sort(order[:held]))
        x_train, y_train, x_test, y_test = x_train[keep], y_train[keep], x_train[out], y_train[out]
    else:
        x_test, y_test = _pair(test, "test")
    if x_test.shape[1:] != x_train.shape[1:]:
        raise DataError(
            f"test: samples of shape {list(x_test.shape[1:])}; train has {list(x_train.shape[1:])}"
        )
    classes = int(torch.cat([y_train, y_test]).max()) + 1
    return Dataset("custom", x_train, y_train, x_test, y_test, num_classes=classes)
