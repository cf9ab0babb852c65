"""The papers' main tables at full scale (``examples/``), for a user who has the data and a GPU: each config
validates, and its first round runs here on generated files in the real formats (CIFAR-10 python pickles,
LEAF json), with the paper's model, algorithm and hyper-parameters: only the data root, the number of rounds
and, where generated files cannot be full size, what depends on the data's volume change (``SCALED``).
Heavy first rounds are marked slow; the other CIFAR-10 ones run in CI's step of long runs (``ci``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

import fedge
from fedge.config import load_config

EXAMPLES = Path(__file__).parents[2] / "examples"
PAPER_SCALE = {
    "cse-cifar10": "cifar10",  # CSE-FSL Table V (and its baselines by `fedge compare`)
    "light-fedsl-cifar10": "cifar10",  # lightweight FedSL Figs. 2-4
    "cse-femnist": "femnist",  # CSE-FSL Table V, F-EMNIST
    "afind-cifar10": "cifar10",  # AFIND+ Table 1
    "hist-cifar-table2": "cifar10",  # HIST Table II
}
SCALED = {
    "afind-cifar10": ["partition.min_size=2"],  # 5,000 generated images over 100 Dirichlet-0.1 clients
    "cse-femnist": ["partition.num_clients=40"],  # 40 generated writers, not 3,500
}
SLOW = {
    "afind-cifar10",
    "hist-cifar-table2",
}  # first rounds of 100 clients x 5 epochs; 60 clients x 200 steps
CI_ONLY = {"cse-cifar10", "light-fedsl-cifar10"}  # 5,000 images a first round: CI's step of long runs


def write_cifar10(root: Path, per_batch: int = 1000, test: int = 200) -> None:
    """CIFAR-10's six python pickles (the archive's folder, keys and dtypes) with random images."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, n in [*((f"data_batch_{i}", per_batch) for i in range(1, 6)), ("test_batch", test)]:
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))


def write_leaf(root: Path, writers: int, samples: int) -> None:
    """LEAF FEMNIST's train/ and test/ json files with ``writers`` writers of ``samples`` 0/1 images."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        users = [f"f{w:04d}_00" for w in range(writers)]
        data = {
            u: {"x": rng.integers(0, 2, (samples, 784)).tolist(), "y": rng.integers(0, 62, samples).tolist()}
            for u in users
        }
        record = {"users": users, "num_samples": [samples] * writers, "user_data": data}
        (root / split / "all_data_0.json").write_text(json.dumps(record))


CASES = [
    pytest.param(name, marks=pytest.mark.slow if name in SLOW else pytest.mark.ci)
    if name in SLOW | CI_ONLY
    else name
    for name in PAPER_SCALE
]


@pytest.mark.parametrize("name", CASES)
def test_a_paper_scale_example_runs_its_first_round_on_files_in_the_real_format(tmp_path, name):
    path = EXAMPLES / f"{name}.yaml"
    config = load_config(path)
    assert config.rounds >= 200  # the paper's scale, not a shortened run
    data = tmp_path / "data"
    if PAPER_SCALE[name] == "cifar10":
        write_cifar10(data)
    else:
        write_leaf(data, writers=40, samples=25)  # batch 10 and h = 2: a client needs 2 full batches
    overrides = [f"data.root={data}", "rounds=1", f"output.dir={tmp_path / 'runs'}", "output.plots=false"]
    overrides += SCALED.get(name, [])
    result = fedge.run(str(path), overrides)
    rows = result.metrics
    assert [row["round"] for row in rows] == [1] and np.isfinite(rows[0]["train_loss"])
    bits = sum(result.summary[f"bits_{way}"] for way in ("up", "down", "peer"))
    assert 0.0 <= rows[0]["accuracy"] <= 1.0 and bits > 0
