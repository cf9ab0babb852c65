"""Split learning client after client on the batched executor: each client's maps run the sequential
kernels (no vmap of one client, which cost 2-3 times the round), with the very same numbers."""

from __future__ import annotations

from unittest import mock

from tiers import parametrize_first_by_default

import fedge
from fedge.engine import executors


def _config(tmp_path, executor: str, algorithm: str) -> dict:
    return {
        "seed": 2,
        "rounds": 1,
        "data": {
            "name": "synthetic",
            "num_train": 120,
            "num_test": 40,
            "shape": [1, 28, 28],
            "num_classes": 4,
        },
        "partition": {"kind": "iid", "num_clients": 3},
        "model": {"name": "lenet5", "cut": 2, "aux": {"kind": "linear"}, "options": {"dropout": 0.3}},
        "algorithm": {"name": algorithm, "batch_size": 16, "server_order": "client_after_client"},
        "engine": {"executor": executor},
        "output": {"dir": str(tmp_path / executor), "plots": False},
    }


@parametrize_first_by_default("algorithm", ["splitfed_v2", "cse_fsl"])
def test_client_after_client_maps_one_client_without_vmap_and_changes_no_number(tmp_path, algorithm):
    with mock.patch.object(executors, "_vmapped", wraps=executors._vmapped) as vmapped:
        batched = fedge.run(_config(tmp_path, "batched", algorithm))
    assert vmapped.call_count == 0
    sequential = fedge.run(_config(tmp_path, "sequential", algorithm))

    def numbers(result):
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in result.metrics]

    assert numbers(batched) == numbers(sequential)
