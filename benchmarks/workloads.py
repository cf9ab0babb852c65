"""The benchmark workloads (W1-W3 of issue 8, plus a tiny one for smoke tests) as fedge run configs.

Every workload is one FedAvg round in which all clients train: iid split, plain SGD, fixed local epochs
and batch size. The same config builds the fedge run, tells the centralized reference what to train,
and is rebuilt inside every Flower client, so all of them see the same data, split, initial weights
(fedge's seeded model factory) and batches (fedge's batch plans).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedge.config import RunConfig, parse_config


@dataclass(frozen=True)
class Workload:
    """One FedAvg benchmark setting."""

    name: str
    description: str
    model: str
    clients: int
    batch_size: int
    data: dict[str, Any] = field(default_factory=lambda: {"name": "mnist"})
    model_options: dict[str, Any] = field(default_factory=dict)
    local_epochs: int = 1
    lr: float = 0.05

    def config(
        self,
        device: str = "cpu",
        executor: str = "batched",
        threads: int | None = None,
        compile_step: bool = False,
        seed: int = 0,
    ) -> RunConfig:
        """The fedge run config of this workload."""
        return parse_config(
            {
                "seed": seed,
                "data": dict(self.data),
                "partition": {"kind": "iid", "num_clients": self.clients},
                "model": {"name": self.model, "options": dict(self.model_options)},
                "algorithm": {
                    "name": "fedavg",
                    "local_epochs": self.local_epochs,
                    "batch_size": self.batch_size,
                    "optimizer": {"lr": self.lr},
                },
                "engine": {
                    "executor": executor,
                    "device": device,
                    "threads": threads,
                    "compile": compile_step,
                },
                "output": {"plots": False},
            }
        )


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "W1",
            "MLP 784-200-10, 100 clients x 600 MNIST, batch 32",
            "mlp",
            100,
            32,
            model_options={"hidden": [200]},
        ),
        Workload("W2", "LeNet-5, 100 clients x 600 MNIST, batch 32", "lenet5", 100, 32),
        Workload(
            "W3",
            "MLP 784-200-10, 1,000 clients x 60 MNIST, batch 20",
            "mlp",
            1000,
            20,
            model_options={"hidden": [200]},
        ),
        Workload(
            "tiny",
            "MLP 36-16-10, 6 clients x 40 synthetic samples, batch 8 (smoke test)",
            "mlp",
            6,
            8,
            data={"name": "synthetic", "num_train": 240, "num_test": 60, "shape": [1, 6, 6]},
            model_options={"hidden": [16]},
        ),
    )
}


def get_workload(name: str) -> Workload:
    """The workload called ``name`` (KeyError naming the known ones otherwise)."""
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
