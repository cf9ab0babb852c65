"""An algorithm from an installed package (an entry point) works in every command: run, compare, sweep
(in this process and in worker processes), resume, list and schema; a bad one fails in one line with one
prefix."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedge.cli.commands import app
from fedge.errors import ConfigError
from fedge.experiments.sweep import load_sweep, plan

PLUGIN = '''
"""FedAvg with a proximal weight that does nothing: an algorithm a researcher ships as a package."""
from typing import Literal

from pydantic import Field

from fedge.algorithms.fedavg import FedAvg, FedAvgConfig


class MyProxConfig(FedAvgConfig):
    name: Literal["myprox"] = "myprox"
    mu: float = Field(0.0, ge=0.0, description="proximal weight")


class MyProx(FedAvg):
    """MyProx: FedAvg under another name."""

    config_class = MyProxConfig
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch, registries) -> Path:
    """``myprox_plugin`` installed (package and dist-info with its entry point) on ``sys.path``."""
    site = tmp_path / "site"
    (site / "myprox_plugin").mkdir(parents=True)
    (site / "myprox_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "myprox_plugin-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myprox-plugin\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[fedge.algorithms]\nmyprox = myprox_plugin:MyProx\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(folder: Path, rounds: int = 2, **extra) -> Path:
    raw = {
        "rounds": rounds,
        "data": {"name": "synthetic", "num_train": 200, "num_test": 80, "shape": [1, 4, 4], "num_classes": 3},
        "partition": {"kind": "iid", "num_clients": 3},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "algorithm": {"name": "myprox", "batch_size": 16, "mu": 0.1},
        "output": {"dir": str(folder / "runs"), "plots": False},
        **extra,
    }
    path = folder / "myprox.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.ci
def test_a_plugin_algorithm_runs_compares_and_resumes_from_the_command_line(plugin):
    config = _config(plugin)
    _invoke("run", str(config), "--quiet")
    run_dir = plugin / "runs" / "myprox-synthetic"
    assert json.loads((run_dir / "summary.json").read_text())["algorithm"] == "myprox"
    (run_dir / "summary.json").unlink()
    resumed = _invoke("resume", str(run_dir), "--quiet")
    assert "myprox" in resumed.output
    compared = _invoke("compare", str(config), "-a", "myprox,fedavg", "--json", "-q")
    assert [row["algorithm"] for row in json.loads(compared.output)["rows"]] == ["myprox", "fedavg"]
    assert "mu" in _invoke("list", "--algorithm", "myprox").output
    assert "algorithm:myprox" in json.loads(_invoke("schema").output)["$defs"]


def test_a_plugin_algorithm_sweeps_from_the_command_line(plugin):
    config = _config(plugin, rounds=1)
    out = _invoke("sweep", str(config), "-g", "algorithm.mu=0.1,0.2", "-s", "1", "--json", "-q")
    assert len(json.loads(out.output)["cells"]) == 2


@pytest.mark.slow
def test_a_plugin_algorithm_sweeps_in_worker_processes(plugin):
    config = _config(plugin, rounds=1)
    out = _invoke("sweep", str(config), "-g", "algorithm.mu=0.1,0.2", "-s", "1", "-j", "2", "--json", "-q")
    assert len(json.loads(out.output)["cells"]) == 2


def test_an_unknown_algorithm_in_a_sweep_is_named_once(tmp_path):
    config = _config(tmp_path)
    with pytest.raises(ConfigError) as caught:
        plan(*load_sweep(str(config)))
    assert str(caught.value).startswith("algorithm: unknown algorithm 'myprox'")
    assert "algorithm: algorithm:" not in str(caught.value)
    result = CliRunner().invoke(app, ["sweep", str(config), "--quiet"])
    assert result.exit_code == 2
    assert result.output.count("algorithm:") == 1, result.output


def test_every_layer_above_extend_reads_configs_through_the_plugin_aware_readers():
    """``fedge.config``'s parse_config / load_config know only what is registered; the rest of the package
    reads configs through ``fedge.extend``'s, which load the plugins first."""
    package = Path(__file__).resolve().parents[2] / "src" / "fedge"
    readers = ("parse_config", "load_config")
    exempt = {"config.py", "extend.py"}
    exempt.add("intake/precheck.py")  # checks before anything is imported: plugins by their names
    found = []
    for path in sorted(package.rglob("*.py")):
        if str(path.relative_to(package)) in exempt:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "fedge.config":
                found += [f"{path.name}: {a.name}" for a in node.names if a.name in readers]
    assert not found, found
