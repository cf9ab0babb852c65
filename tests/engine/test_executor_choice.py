"""``engine.executor: auto`` (the default) runs the executor that is faster for the configuration, and
the run says which one it ran."""

from __future__ import annotations

import json

import pytest

import fedge
from fedge.algorithms.base import executor_name


@pytest.mark.parametrize(
    ("overrides", "device", "expected"),
    [
        (["algorithm.name=cse_fsl", "model.cut=1", "partition.num_clients=5"], "cpu", "sequential"),
        (["algorithm.name=splitfed_v2", "model.cut=1", "partition.num_clients=20"], "cpu", "batched"),
        (
            [
                "algorithm.name=splitfed_v2",
                "model.cut=1",
                "partition.num_clients=40",
                "algorithm.participation=without_replacement",
                "algorithm.clients_per_round=8",
            ],
            "cpu",
            "sequential",
        ),
        (
            [
                "algorithm.name=cse_fsl",
                "model.cut=1",
                "partition.num_clients=40",
                "algorithm.server_order=client_after_client",
            ],
            "cpu",
            "sequential",
        ),
        (["algorithm.name=light_fedsl", "model.cut=1", "partition.num_clients=5"], "cpu", "sequential"),
        (["algorithm.name=cse_fsl", "model.cut=1", "partition.num_clients=5"], "cuda", "batched"),
        (["algorithm.name=fedavg", "partition.num_clients=5"], "cpu", "batched"),
        (["algorithm.name=splitfed_v2", "model.name=gpt2", "data.name=pystdlib", "model.cut=2",
          "partition.num_clients=32"], "cpu", "sequential"),  # fmt: skip  # a transformer's serial server
        (["algorithm.name=splitfed_v2", "model.name=gpt2", "data.name=pystdlib", "model.cut=2"], "cuda",
         "batched"),  # fmt: skip
        (["algorithm.name=fedavg", "model.name=gpt2", "data.name=pystdlib"], "cpu", "batched"),
        (["algorithm.name=gossip", "partition.num_clients=5"], "cpu", "batched"),
        (["algorithm.name=cse_fsl", "model.cut=1", "engine.executor=batched"], "cpu", "batched"),
        (["algorithm.name=fedavg", "engine.executor=sequential"], "cpu", "sequential"),
    ],
)
def test_auto_picks_the_faster_executor_for_the_configuration(overrides, device, expected):
    config = fedge.resolve_config(None, overrides)
    assert executor_name(config, device) == expected


def test_auto_is_the_default_and_the_run_records_what_it_ran(tmp_path):
    overrides = ["algorithm.name=cse_fsl", "model.cut=1", "partition.num_clients=3", "rounds=1"]
    result = fedge.run(None, [*overrides, f"output.dir={tmp_path}", "output.plots=false"])
    environment = json.loads((result.run_dir / "environment.json").read_text())
    assert fedge.resolve_config(None, overrides).engine.executor == "auto"
    assert environment["executor"] == "sequential"
