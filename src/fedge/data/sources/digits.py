"""scikit-learn's bundled handwritten digits: the default dataset, available offline everywhere."""

from __future__ import annotations

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.rng import numpy_rng

# Mean and std of all 1,797 images after scaling to [0, 1] (computed once from the bundled data).
MEAN = 0.30526
STD = 0.37605


def stratified_split(
    labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Ascending train and test indices with ``round(test_fraction * n_c)`` test samples of each class c."""
    test = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        test.append(rng.choice(members, size=round(test_fraction * members.size), replace=False))
    is_test = np.zeros(labels.size, dtype=bool)
    is_test[np.concatenate(test)] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def load_digits_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """8x8 digits ``[N,1,8,8]``, 10 classes, split into train/test by ``cfg.test_fraction`` per class."""
    from sklearn.datasets import load_digits  # a second to import: only when the digits are loaded

    bunch = load_digits()
    x = torch.from_numpy(((bunch.data / 16.0 - MEAN) / STD).astype(np.float32)).view(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    split = stratified_split(y, cfg.test_fraction, numpy_rng(seed, "digits-split"))
    train, test = (torch.from_numpy(indices) for indices in split)
    labels = torch.from_numpy(y)
    return Dataset("digits", x[train], labels[train], x[test], labels[test], num_classes=10)
