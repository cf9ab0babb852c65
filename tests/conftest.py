"""Shared test fixtures: one thread (small models run fastest so) and small, fast configs."""

from __future__ import annotations

import pytest
import torch

import fedge.algorithms  # noqa: F401  (fills the algorithm registry for tests that parse configs directly)
from fedge import extend
from fedge.algorithms import ALGORITHMS
from fedge.config import AlgorithmConfig, DataConfig
from fedge.data.sources import SOURCES
from fedge.models import MODELS

torch.set_num_threads(1)


@pytest.fixture
def tiny_config(tmp_path) -> dict:
    """A FedAvg run on a small synthetic set that finishes in about a second."""
    return {
        "seed": 3,
        "rounds": 4,
        "data": {
            "name": "synthetic",
            "num_train": 400,
            "num_test": 200,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "dirichlet", "num_clients": 5, "alpha": 0.5, "min_size": 5},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "algorithm": {"name": "fedavg", "batch_size": 16, "optimizer": {"lr": 0.1}},
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }


@pytest.fixture
def registries():
    """Registries as they were before the test (registrations are process-wide)."""
    saved = (dict(MODELS), dict(SOURCES), dict(ALGORITHMS), dict(AlgorithmConfig.registry))
    names, loaded = set(DataConfig.registered), set(extend._LOADED)
    yield
    for table, old in zip((MODELS, SOURCES, ALGORITHMS, AlgorithmConfig.registry), saved, strict=True):
        table.clear()
        table.update(old)
    DataConfig.registered.clear()
    DataConfig.registered.update(names)
    extend._LOADED.clear()
    extend._LOADED.update(loaded)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep each test module whose tests share a module-scoped fixture on one xdist worker (addopts'
    ``--dist loadgroup``): under plain load balancing every worker that drew one of its tests built the
    fixture again (two 2-rank gloo launches of every family, the language models' runs). First among
    the hooks: xdist reads the group into the test's id in its own, which runs before a plain one."""
    for item in items:
        module, definitions = item.getparent(pytest.Module), getattr(item, "_fixtureinfo", None)
        if module is None or definitions is None:
            continue
        shared = any(
            fixture.scope == "module" and fixture.baseid == module.nodeid
            for fixtures in definitions.name2fixturedefs.values()
            for fixture in fixtures
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(module.nodeid))
