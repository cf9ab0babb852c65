"""The extension API: a caller's model, data and loss in fedge.run; registries; one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiers import parametrize_first_by_default
from torch import nn
from typer.testing import CliRunner

import fedge
from fedge.cli.commands import app
from fedge.config import AlgorithmConfig
from fedge.errors import ConfigError, DataError


def arrays(n: int = 240, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, 6)).astype(np.float32) + y[:, None]
    return x, y


def mlp(classes: int = 3) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, classes))


def config(tmp_path, algorithm: str = "fedavg", **extra) -> dict:
    return {
        "rounds": 2,
        "partition": {"kind": "iid", "num_clients": 3},
        "algorithm": {"name": algorithm, "batch_size": 16},
        "output": {"dir": str(tmp_path), "plots": False},
        **extra,
    }


def test_a_torch_dataset_and_arrays_give_the_same_run(tmp_path):
    x, y = arrays()
    pairs = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    by_arrays = fedge.run(config(tmp_path), model=mlp(), train=(x, y))
    by_dataset = fedge.run(config(tmp_path), model=mlp(), train=pairs)

    def numbers(result):
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in result.metrics]

    assert numbers(by_arrays) == numbers(by_dataset)
    assert by_arrays.summary["dataset"] == "custom"
    assert "name: custom" in (by_arrays.run_dir / "config.yaml").read_text()


def test_the_partitioner_splits_user_data_as_it_splits_built_in_data(tmp_path):
    x, y = arrays(300)
    built = fedge.runner.loop.build_run(
        fedge.resolve_config(
            config(tmp_path, partition={"kind": "dirichlet", "num_clients": 4, "alpha": 0.3})
        ),
        extensions=fedge.runner.loop.Extensions(model=mlp(), train=(x, y), test=arrays(60, seed=1)),
    )
    parts = built.context.data.client_train
    assert sum(len(p) for p in parts) == 300 and len(parts) == 4
    assert len({len(p) for p in parts}) > 1  # Dirichlet: unequal clients


@parametrize_first_by_default("algorithm", ["fedavg", "cse_fsl", "splitfed_v1"])
def test_a_custom_loss_trains_every_part_that_has_a_loss(tmp_path, algorithm):
    x, y = arrays()
    calls = []

    def loss(logits, labels):
        calls.append(logits.shape[-1])
        ce = nn.functional.cross_entropy(logits, labels, reduction="none")
        return (1 - torch.exp(-ce)) ** 2 * ce  # the focal loss, gamma = 2

    model = mlp()
    model.cut = 2
    custom = fedge.run(config(tmp_path, algorithm), model=model, train=(x, y), loss=loss)
    plain = fedge.run(config(tmp_path, algorithm), model=model, train=(x, y))
    assert calls and custom.metrics[-1]["train_loss"] != plain.metrics[-1]["train_loss"]


def test_algorithms_with_their_own_loss_terms_refuse_another(tmp_path):
    with pytest.raises(ConfigError, match="^train.loss: ditto trains with its own cross-entropy"):
        fedge.run(config(tmp_path, "ditto"), model=mlp(), train=arrays(), loss=nn.functional.cross_entropy)


def test_a_cut_that_names_no_block_is_one_line(tmp_path):
    model = mlp()
    model.cut = "conv9"
    with pytest.raises(ConfigError, match=r"^model.cut: names no block 'conv9'; blocks: 0, 1, 2$"):
        fedge.run(config(tmp_path, "cse_fsl"), model=model, train=arrays())
    model.cut = 7
    with pytest.raises(ConfigError, match=r"^model.cut: got 7; a cut keeps a block on each side: 1..2$"):
        fedge.run(config(tmp_path, "cse_fsl"), model=model, train=arrays())
    assert not list(tmp_path.iterdir())


def test_labels_that_do_not_fit_the_model_are_one_line(tmp_path):
    with pytest.raises(
        DataError, match=r"^labels: they name 5 classes \(0..4\) but the model outputs shape \[3\]"
    ):
        fedge.run(config(tmp_path), model=mlp(3), train=arrays(classes=5))


def test_a_registered_model_and_dataset_run_from_yaml(tmp_path, registries):
    def wide_mlp(input_shape, num_classes, *, hidden: int = 8) -> nn.Module:
        """A one-hidden-layer MLP of width ``hidden``."""
        return nn.Sequential(
            nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.Linear(hidden, num_classes)
        )

    def blobs(cfg, seed):
        """Three Gaussian blobs in 6 dimensions."""
        return arrays(seed=seed), arrays(60, seed=seed + 1)

    fedge.register_model("wide_mlp", wide_mlp)
    fedge.register_dataset("blobs", blobs)
    text = (
        "rounds: 1\ndata: {name: blobs}\nmodel: {name: wide_mlp, options: {hidden: 5}}\n"
        f"partition: {{kind: iid, num_clients: 2}}\noutput: {{dir: {tmp_path}, plots: false}}\n"
    )
    result = fedge.run(text)
    assert result.summary["dataset"] == "blobs"
    with pytest.raises(
        ConfigError, match="^model.options.depth: unknown option for wide_mlp; known: hidden$"
    ):
        fedge.run(text.replace("hidden: 5", "depth: 5"))


@pytest.mark.parametrize(
    ("register", "name"),
    [("register_model", "mlp"), ("register_dataset", "digits"), ("register_algorithm", "fedavg")],
)
def test_a_name_that_collides_with_a_built_in_is_one_line(register, name, registries):
    kind = register.removeprefix("register_")
    collides = f"collides with fedge's built-in {kind} '{name}'; choose another name"
    pattern = rf"^fedge.{register}\('{name}'\): {collides}$"
    with pytest.raises(ConfigError, match=pattern):
        args = (object, AlgorithmConfig) if kind == "algorithm" else (lambda *a: None,)
        getattr(fedge, register)(name, *args)


def test_a_registered_model_too_narrow_for_the_labels_exits_2_from_the_cli(tmp_path, registries):
    def two_way(input_shape, num_classes):
        """Always two logits, whatever the data's classes."""
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 2))

    fedge.register_model("two_way", two_way)
    config = tmp_path / "run.yaml"
    config.write_text(
        "data: {name: synthetic, num_classes: 4}\nmodel: {name: two_way}\n"
        f"output: {{dir: {tmp_path / 'runs'}}}\n"
    )
    result = CliRunner().invoke(app, ["run", str(config), "--quiet"])
    assert result.exit_code == 2
    message = "they name 4 classes (0..3) but the model outputs shape [2] per sample; it needs 4 logits"
    assert result.output.strip().splitlines() == [f"error: labels: {message}"]
    assert not (tmp_path / "runs").exists()


def test_a_config_may_be_yaml_text():
    assert fedge.resolve_config("rounds: 4\nseed: 2").rounds == 4
    assert fedge.resolve_config("{rounds: 3}").rounds == 3
    with pytest.raises(ConfigError, match="^nowhere.yaml: cannot read config file"):
        fedge.resolve_config("nowhere.yaml")
