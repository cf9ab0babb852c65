"""docs/extending.md's examples, run as they are: a custom CNN on numpy arrays (FedAvg, then CSE-FSL
cut after its second block), FedProx added as an algorithm and run from YAML, and a model and a dataset
from a separate package through entry points (installed here as a dist-info folder on sys.path); the
median stage is shown word for word here and run by tests/aggregation/test_aggregation.py."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from typer.testing import CliRunner

import fedge
from fedge.cli.commands import app
from fedge.runner.loop import Extensions, build_run

ROOT = Path(__file__).parents[2]
GUIDE = ROOT / "docs" / "extending.md"
EXAMPLES = ROOT / "examples" / "extending"
PLUGIN = EXAMPLES / "fedge_tinyplugin"
SHOWN = [
    "custom_cnn.py",
    "fedprox.py",
    "fedprox.yaml",
    "median.py",
    "fedge_tinyplugin/pyproject.toml",
    "fedge_tinyplugin/src/fedge_tinyplugin/__init__.py",
    "fedge_tinyplugin/stripes.yaml",
]


def load(path: Path) -> ModuleType:
    """Import an example file as a module (running its top level, as `python FILE` would)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", SHOWN)
def test_the_guide_shows_each_example_file_word_for_word(name):
    assert (EXAMPLES / name).read_text().rstrip("\n") in GUIDE.read_text()


@pytest.mark.ci
def test_custom_cnn_on_numpy_arrays_with_fedavg_then_cse_fsl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    example = load(EXAMPLES / "custom_cnn.py")
    results = example.main()
    for result in results.values():
        assert result.summary["status"] == "finished"
        assert result.summary["final_accuracy"] > 0.5  # 4 classes: chance is 0.25
    kinds = results["cse_fsl"].metrics[-1]["bits_by_kind"]
    assert kinds["smashed_up"] > 0 and "grad_down" not in kinds
    config = results["cse_fsl"].config
    ext = Extensions(model=example.cnn, train=example.train, test=example.test)
    parts = build_run(config, extensions=ext).algorithm.parts
    assert parts.cut == 2 and parts.smashed_shape == (16, 3, 3)  # after block2


def test_fedprox_is_a_short_algorithm_run_from_yaml(tmp_path, monkeypatch, registries):
    assert len((EXAMPLES / "fedprox.py").read_text().splitlines()) <= 60
    monkeypatch.chdir(tmp_path)
    load(EXAMPLES / "fedprox.py")
    result = fedge.run(str(EXAMPLES / "fedprox.yaml"))
    assert result.summary["algorithm"] == "fedprox" and result.summary["final_accuracy"] > 0.4
    raw = yaml.safe_load((EXAMPLES / "fedprox.yaml").read_text())
    without_prox = fedge.run(str(EXAMPLES / "fedprox.yaml"), ["algorithm.mu=0"])
    raw["algorithm"] = {k: v for k, v in raw["algorithm"].items() if k != "mu"} | {"name": "fedavg"}
    raw["engine"] = {"fused": False}  # FedAvg's dense step would otherwise take the fused kernel
    fedavg = fedge.run(raw)
    assert [r["train_loss"] for r in without_prox.metrics] == [r["train_loss"] for r in fedavg.metrics]
    assert [r["train_loss"] for r in result.metrics] != [r["train_loss"] for r in fedavg.metrics]
    listed = CliRunner().invoke(app, ["list", "--algorithm", "fedprox", "--json"])
    mu = next(row for row in json.loads(listed.output) if row["key"] == "mu")
    assert mu["default"] == 0.01 and "proximal" in mu["description"]


def install(site: Path, entry_points: dict[str, dict[str, str]]) -> None:
    """What `pip install ./fedge_tinyplugin` leaves: the package and its dist-info with entry points."""
    shutil.copytree(PLUGIN / "src" / "fedge_tinyplugin", site / "fedge_tinyplugin")
    info = site / "fedge_tinyplugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedge-tinyplugin\nVersion: 0.1.0\n")
    groups = "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items()) + "\n"
        for group, points in entry_points.items()
    )
    (info / "entry_points.txt").write_text(groups)


def test_a_model_and_dataset_from_a_separate_package(tmp_path, monkeypatch, registries):
    declared = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]["entry-points"]
    install(tmp_path / "site", declared)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    listed = json.loads(CliRunner().invoke(app, ["list", "--json"]).output)["plugins"]
    assert listed["models"] == {"tiny_cnn": "fedge_tinyplugin:build_tiny_cnn"}
    assert listed["datasets"] == {"stripes": "fedge_tinyplugin:load_stripes"}
    monkeypatch.chdir(tmp_path)
    result = fedge.run(str(PLUGIN / "stripes.yaml"))
    assert result.summary["dataset"] == "stripes" and result.summary["status"] == "finished"
    assert result.summary["final_accuracy"] > 0.5


def test_a_plugin_name_that_collides_with_a_built_in_stops_the_cli_in_one_line(
    tmp_path, monkeypatch, registries
):
    install(tmp_path / "site", {"fedge.models": {"mlp": "fedge_tinyplugin:build_tiny_cnn"}})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    config = tmp_path / "run.yaml"
    config.write_text(f"rounds: 1\noutput: {{dir: {tmp_path}}}\n")
    result = CliRunner().invoke(app, ["run", str(config), "--quiet"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: fedge.register_model('mlp'): collides with fedge's built-in model 'mlp'; choose another name"
    ]
