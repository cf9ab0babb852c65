"""CIFAR-10 and CIFAR-100 from the official "python version" pickles.

``data.root`` may name the extracted folder itself (``cifar-10-batches-py`` / ``cifar-100-python``) or
the folder that holds it. Without a root the cache ``~/.cache/fedge/<name>/`` is searched, and with
``data.download=true`` the official archive is fetched there and extracted. The batches are read by a
restricted unpickler (:mod:`fedge.data.sources.safe_pickle`): a file that asks for anything but plain
arrays, lists, numbers and bytes is refused before any of it runs, so a crafted batch cannot run code.
"""

from __future__ import annotations

import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.data.sources import safe_pickle
from fedge.data.sources.fetch import cache_folder, download, not_found
from fedge.errors import DataError


@dataclass(frozen=True)
class CifarSpec:
    """Layout, labels key and per-channel normalisation of one CIFAR variant."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    label_key: bytes
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    url: str


SPECS = {
    "cifar10": CifarSpec(
        "cifar10",
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
        b"labels",
        10,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    ),
    "cifar100": CifarSpec(
        "cifar100",
        "cifar-100-python",
        ("train",),
        "test",
        b"fine_labels",
        100,
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    ),
}


def _complete(folder: Path, spec: CifarSpec) -> bool:
    """Whether ``folder`` holds every pickle of ``spec``."""
    return all((folder / name).is_file() for name in (*spec.train_files, spec.test_file))


def _fetch(dest: Path, spec: CifarSpec) -> Path:
    """Download and extract the official archive into ``dest``; return the extracted folder."""
    archive = download([spec.url], dest / Path(spec.url).name)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            (Path(tmp) / spec.folder).replace(dest / spec.folder)
        except (OSError, tarfile.TarError) as error:
            raise DataError(f"{archive}: cannot extract into {dest / spec.folder} ({error})") from None
    archive.unlink()
    return dest / spec.folder


def _locate(cfg: DataConfig, spec: CifarSpec) -> Path:
    """The folder holding the pickles, downloading them if allowed and needed."""
    base = Path(cfg.root).expanduser() if cfg.root is not None else cache_folder(spec.name)
    candidates = (base, base / spec.folder)
    for folder in candidates:
        if _complete(folder, spec):
            return folder
    if cfg.download:
        return _fetch(base, spec)
    if cfg.root is None:
        raise not_found(spec.name, candidates, None)
    folder = base / spec.folder if (base / spec.folder).is_dir() else base
    missing = next(n for n in (*spec.train_files, spec.test_file) if not (folder / n).is_file())
    raise DataError(f"{folder / missing}: CIFAR pickle not found; fix data.root or set data.download=true")


def _read_batch(path: Path, spec: CifarSpec) -> tuple[np.ndarray, np.ndarray]:
    """Pixels ``uint8 [N,3072]`` and labels ``int64 [N]`` of one pickled batch, checked."""
    try:
        batch = safe_pickle.load(path)
    except safe_pickle.Refused as error:
        raise DataError(f"{path}: refused: {error}, which no CIFAR batch holds (it was not run)") from None
    except Exception as error:  # a damaged pickle can raise nearly anything
        raise DataError(f"{path}: cannot unpickle CIFAR batch ({type(error).__name__}: {error})") from None
    if not isinstance(batch, dict) or b"data" not in batch or spec.label_key not in batch:
        raise DataError(f"{path}: not a CIFAR batch (needs keys b'data' and {spec.label_key!r})")
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[spec.label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: b'data' must be uint8 [N,3072], got {data.dtype} {list(data.shape)}")
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: {spec.label_key!r} must hold {data.shape[0]} integer labels")
    if labels.size and not 0 <= labels.min() <= labels.max() < spec.num_classes:
        raise DataError(f"{path}: labels outside 0..{spec.num_classes - 1}")
    return data, labels.astype(np.int64)


def _tensors(paths: list[Path], spec: CifarSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[N,3,32,32]`` (scaled, normalised per channel) and labels of the given batches."""
    batches = [_read_batch(path, spec) for path in paths]
    pixels = np.concatenate([data for data, _ in batches]).reshape(-1, 3, 32, 32)
    x = torch.from_numpy(pixels.astype(np.float32)).div_(255.0)
    mean, std = torch.tensor(spec.mean).view(1, 3, 1, 1), torch.tensor(spec.std).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std), torch.from_numpy(np.concatenate([labels for _, labels in batches]))


def _load(cfg: DataConfig, spec: CifarSpec) -> Dataset:
    folder = _locate(cfg, spec)
    x_train, y_train = _tensors([folder / name for name in spec.train_files], spec)
    x_test, y_test = _tensors([folder / spec.test_file], spec)
    return Dataset(spec.name, x_train, y_train, x_test, y_test, num_classes=spec.num_classes)


def load_cifar10(cfg: DataConfig, seed: int) -> Dataset:
    """CIFAR-10 (50k/10k, 3x32x32, 10 classes). ``seed`` is unused: the split is fixed."""
    return _load(cfg, SPECS["cifar10"])


def load_cifar100(cfg: DataConfig, seed: int) -> Dataset:
    """CIFAR-100 with fine labels (50k/10k, 3x32x32, 100 classes). ``seed`` is unused."""
    return _load(cfg, SPECS["cifar100"])
