"""FEMNIST in LEAF's json format, with each sample's writer as its natural group.

``data.root`` must hold LEAF's ``train/`` and ``test/`` folders of ``*.json`` files. There is no
download: LEAF builds these files with its own preprocessing pipeline (https://github.com/TalwarLab/leaf).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.errors import DataError
from fedge.files.regular import NotReadable, read_regular

NUM_CLASSES = 62
PIXELS = 28 * 28
# Mean and std of LEAF's FEMNIST pixels (values in [0, 1], white background), as commonly used.
MEAN = 0.9637
STD = 0.1592
HOW_TO = "run LEAF's femnist preprocessing (https://github.com/TalwarLab/leaf) and set data.root to its data/"

MAX_JSON_BYTES = 2**30  # a LEAF json file larger than this is refused unread (LEAF's are ~100 MB)
Writers = dict[str, tuple[np.ndarray, np.ndarray]]


def _read_file(path: Path, writers: Writers) -> None:
    """Add the ``(x [n,784] float32, y [n] int64)`` of every writer in one LEAF json file to ``writers``."""
    try:
        user_data = json.loads(read_regular(path, MAX_JSON_BYTES))["user_data"]
    except NotReadable as error:
        raise DataError(f"{path}: {error} (data.root)") from None
    except (ValueError, KeyError, TypeError, RecursionError) as error:
        raise DataError(f"{path}: not a LEAF json file with 'user_data' ({error})") from None
    if not isinstance(user_data, dict):
        raise DataError(f"{path}: 'user_data' must map writer names to their samples")
    for user, record in user_data.items():
        if user in writers:
            raise DataError(f"{path}: writer {user!r} appears twice in the same split")
        try:
            n = len(record["y"])
            x = np.asarray(record["x"], dtype=np.float32).reshape(n, PIXELS)
            y = np.asarray(record["y"], dtype=np.int64).reshape(n)
        except (KeyError, TypeError, ValueError, IndexError):
            raise DataError(
                f"{path}: user_data[{user!r}] needs 'y' (n ints) and 'x' (n lists of 784)"
            ) from None
        if y.size and not 0 <= y.min() <= y.max() < NUM_CLASSES:
            raise DataError(f"{path}: user_data[{user!r}] has labels outside 0..{NUM_CLASSES - 1}")
        writers[user] = (x, y)


def _read_split(folder: Path) -> Writers:
    """All writers of one split folder (``train/`` or ``test/``), by name."""
    if not folder.is_dir():
        raise DataError(f"{folder}: folder not found; data.root must hold LEAF's train/ and test/ folders")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder}: no *.json files; {HOW_TO}")
    writers: Writers = {}
    for path in files:
        _read_file(path, writers)
    if not writers:
        raise DataError(f"{folder}: the *.json files hold no writers; {HOW_TO}")
    return writers


def _tensors(writers: Writers, index: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Normalised images ``[N,1,28,28]``, labels and writer indices, writers in sorted name order."""
    names = sorted(writers)
    x = np.concatenate([writers[name][0] for name in names])
    y = np.concatenate([writers[name][1] for name in names])
    groups = np.repeat(
        np.array([index[name] for name in names], dtype=np.int64), [writers[name][1].size for name in names]
    )
    x -= MEAN
    x /= STD
    return torch.from_numpy(x).view(-1, 1, 28, 28), torch.from_numpy(y), groups


def load_femnist(cfg: DataConfig, seed: int) -> Dataset:
    """FEMNIST (62 classes, 1x28x28) with writer groups. ``seed`` is unused: LEAF fixed the split."""
    if cfg.root is None:
        raise DataError(f"femnist: data.root is not set and FEMNIST cannot be downloaded; {HOW_TO}")
    root = Path(cfg.root).expanduser()
    train, test = _read_split(root / "train"), _read_split(root / "test")
    index = {name: i for i, name in enumerate(sorted(train.keys() | test.keys()))}
    x_train, y_train, g_train = _tensors(train, index)
    x_test, y_test, g_test = _tensors(test, index)
    return Dataset(
        "femnist", x_train, y_train, x_test, y_test, NUM_CLASSES, train_groups=g_train, test_groups=g_test
    )
