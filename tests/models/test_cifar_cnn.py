"""HIST's CIFAR-10 CNN: its size, its cuts for the split family, FedAvg, and HIST / HFedAvg on the Table II
example config over small generated CIFAR-format pickles, the ledger against the Table II formula."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.hierarchical.cost import client_upload_mb, client_upload_values
from fedge.algorithms.hierarchical.masks import partition_layout
from fedge.models import build_model, count_parameters, split
from tests.data.test_data_sources import CIFAR10_SIZES, write_cifar

EXAMPLE = Path(__file__).parents[2] / "examples" / "hist-cifar-table2.yaml"
CONV, FC = 23_584, 517_510  # the paper's conv / FC split of the 541,094 parameters
SHARED, PARTITIONED = CONV + 10, FC - 10  # the output bias belongs to no hidden neuron: shared
BITS_PER_MB = 8 * 2**20


def test_parameter_count_size_and_hidden_layer():
    model = build_model("cifar_cnn", (3, 32, 32), 10)
    assert count_parameters(model) == 541_094 == CONV + FC
    assert pytest.approx(2.064, abs=5e-4) == 541_094 * 4 / 2**20  # Table II's 2.064 MB
    convs = sum(p.numel() for name, p in model.named_parameters() if name.startswith("conv"))
    assert convs == CONV
    (hidden,) = partition_layout(model)
    assert (hidden.producer, hidden.consumer, hidden.width, hidden.fan_in) == (
        "fc1.linear",
        "out.linear",
        500,
        1024,
    )
    assert model.cut_points == [1, 2, 3, 4]
    assert [count_parameters(split(model, cut)[0]) for cut in model.cut_points] == [
        448,
        5_088,
        23_584,
        536_084,
    ]


@pytest.fixture
def cifar_root(tmp_path) -> Path:
    """CIFAR-10 python batches with 24 training images each (120 in all) and 40 test images."""
    sizes = {**{name: 24 for name in CIFAR10_SIZES if name != "test_batch"}, "test_batch": 40}
    write_cifar(tmp_path / "cifar-10-batches-py", "cifar10", sizes)
    return tmp_path


def small(cifar_root: Path, tmp_path: Path, *extra: str) -> list[str]:
    """The Table II example shrunk to 4 clients, one global round of 2 edge rounds of 1 step."""
    return [
        f"data.root={cifar_root}",
        "partition.num_clients=4",
        "rounds=1",
        "algorithm.edge_rounds=2",
        "algorithm.local_steps=1",
        "algorithm.batch_size=8",
        "eval.every=1",
        f"output.dir={tmp_path / 'runs'}",
        "output.plots=false",
        *extra,
    ]


@parametrize_first_by_default("name", ["hist", "hfedavg"])
def test_table_two_example_runs_and_its_ledger_is_the_analytic_upload(cifar_root, tmp_path, name):
    result = fedge.run(EXAMPLE, small(cifar_root, tmp_path, f"algorithm.name={name}"))
    cells = 2 if name == "hist" else 1
    rounds, edge_rounds = 1, 2
    per_client = 32 * client_upload_values(rounds, edge_rounds, SHARED, PARTITIONED, cells)
    ledger = (result.run_dir / "ledger.csv").read_text().splitlines()
    ups = [line.split(",") for line in ledger if ",model_up," in line]
    assert len(ups) == rounds * edge_rounds * 4 and {int(u[-1]) for u in ups} == {per_client / edge_rounds}
    mb = result.metrics[-1]["client_up_mb"]
    assert mb == pytest.approx(per_client / BITS_PER_MB)
    # the paper's MB formula (FC split by N, 2.064 MB per model) agrees to its rounding of the model size
    assert mb == pytest.approx(client_upload_mb(rounds, edge_rounds, 2.064, CONV, FC, cells), rel=1e-4)
    assert 0.0 <= result.metrics[-1]["accuracy"] <= 1.0


@parametrize_first_by_default(
    ("algorithm", "cut"),
    [
        ({"name": "fedavg", "batch_size": 16}, 3),
        ({"name": "splitfed_v2", "batch_size": 16}, 1),
        ({"name": "splitfed_v2", "batch_size": 16}, 4),
        ({"name": "cse_fsl", "batch_size": 16, "h": 1}, 3),
    ],
)
def test_fedavg_and_the_split_family_train_it(cifar_root, tmp_path, algorithm, cut):
    config = {
        "rounds": 1,
        "data": {"name": "cifar10", "root": str(cifar_root)},
        "partition": {"kind": "iid", "num_clients": 2},
        "model": {"name": "cifar_cnn", "cut": cut},
        "algorithm": algorithm,
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }
    result = fedge.run(config)
    assert 0.0 <= result.metrics[-1]["accuracy"] <= 1.0 and result.metrics[-1]["train_loss"] > 0
