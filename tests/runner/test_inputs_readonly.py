"""Every public entry point treats what the caller passes as read-only: a config dict, a RunConfig,
override and algorithm lists, a sweep's base and spec, a model and arrays are unchanged after the call,
so the next call sees exactly what the caller wrote."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import fedge
from fedge.config import RunConfig
from fedge.experiments import sweep
from fedge.experiments.compare import compare


def _arrays(n: int = 120) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, n)
    return rng.normal(size=(n, 6)).astype(np.float32) + y[:, None], y


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_resolve_config_leaves_the_callers_dict_and_overrides_alone(tiny_config):
    before, overrides = copy.deepcopy(tiny_config), ["algorithm.optimizer.lr=0.5", "data.num_train=300"]
    resolved = fedge.resolve_config(tiny_config, list(overrides))
    assert resolved.algorithm.optimizer.lr == 0.5
    assert tiny_config == before
    assert fedge.resolve_config(tiny_config).algorithm.optimizer.lr == 0.1


def test_run_with_overrides_does_not_leak_them_into_the_next_run(tiny_config):
    tiny_config["rounds"] = 1
    before = copy.deepcopy(tiny_config)
    overrides = ["algorithm.optimizer.lr=0.5"]
    first = fedge.run(tiny_config, overrides)
    assert first.config.algorithm.optimizer.lr == 0.5
    assert tiny_config == before and overrides == ["algorithm.optimizer.lr=0.5"]
    assert fedge.run(tiny_config).config.algorithm.optimizer.lr == 0.1


def test_run_leaves_a_callers_run_config_alone(tiny_config):
    tiny_config["rounds"] = 1
    config = RunConfig.model_validate(tiny_config)
    before = config.model_dump()
    fedge.run(config, ["algorithm.optimizer.lr=0.5", "seed=9"])
    assert config.model_dump() == before


def test_run_and_resume_leave_the_callers_model_and_arrays_alone(tmp_path):
    x, y = _arrays()
    x_before, y_before = x.copy(), y.copy()
    model = _mlp()
    weights = _weights(model)
    config = {
        "rounds": 2,
        "partition": {"kind": "iid", "num_clients": 3},
        "algorithm": {"name": "fedavg", "batch_size": 16},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    result = fedge.run(config, model=model, train=(x, y))
    assert np.array_equal(x, x_before) and np.array_equal(y, y_before)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    (result.run_dir / "summary.json").unlink()  # resume replays the last round from the checkpoint
    fedge.resume(result.run_dir, model=model, train=(x, y))
    assert np.array_equal(x, x_before) and np.array_equal(y, y_before)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_run_leaves_a_callers_split_model_and_tensors_alone(tmp_path):
    x, y = (torch.as_tensor(a) for a in _arrays())
    x_before = x.clone()
    model = _mlp()
    model.cut = 2
    weights = _weights(model)
    config = {
        "rounds": 1,
        "partition": {"kind": "iid", "num_clients": 3},
        "algorithm": {"name": "splitfed_v2", "batch_size": 16},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    fedge.run(config, model=model, train=(x, y))
    assert torch.equal(x, x_before) and model.cut == 2 and list(model._modules) == ["0", "1", "2"]
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


@pytest.mark.ci
def test_compare_leaves_the_callers_config_and_lists_alone(tiny_config):
    tiny_config["rounds"] = 1
    config = fedge.resolve_config(tiny_config)
    before = config.model_dump()
    algorithms, seeds = ["fedavg", "local"], [1]
    compare(config, algorithms, seed_list=seeds)
    assert config.model_dump() == before and algorithms == ["fedavg", "local"] and seeds == [1]


def test_sweep_leaves_the_callers_base_spec_and_options_alone(tiny_config, tmp_path):
    tiny_config["rounds"] = 1
    path = tmp_path / "base.yaml"
    path.write_text(RunConfig.model_validate(tiny_config).to_yaml())
    overrides, grid, seeds = ["rounds=1"], ["algorithm.optimizer.lr=0.1,0.2"], [1]
    base, spec = sweep.load_sweep(str(path), overrides, grid, seeds)
    assert (overrides, grid, seeds) == (["rounds=1"], ["algorithm.optimizer.lr=0.1,0.2"], [1])
    base_before, spec_before = copy.deepcopy(base), spec.model_dump()
    sweep.run_sweep(base, spec)
    assert base == base_before and spec.model_dump() == spec_before
