"""Answers in a fraction of a second: a config is validated, and --help, list and schema answer, before
torch or scikit-learn is imported (each checked in a fresh interpreter, whose sys.modules tells)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedge
from fedge import locate, models
from fedge.errors import ConfigError
from fedge.precheck import precheck

ENV = {**os.environ, "PYTHONPATH": str(Path(fedge.__file__).parents[1])}
EXAMPLES = sorted(p.stem for p in locate.examples_dir().glob("*.yaml"))


def _fresh(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter; it must end by printing the heavy modules it imported."""
    heavy = "print(sorted(m for m in ('torch', 'sklearn') if m in sys.modules))"
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\n{heavy}"], env=ENV, capture_output=True, text=True
    )


def test_validation_imports_neither_torch_nor_sklearn():
    done = _fresh(
        "from fedge.errors import ConfigError\n"
        "from fedge.precheck import precheck\n"
        "precheck('example:split-mnist', ['rounds=3', 'algorithm.h=2'])\n"
        "try:\n    precheck(None, ['rounds=0'])\nexcept ConfigError as e:\n    print(e)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["rounds: Input should be greater than 0 (got 0)", "[]"]


@pytest.mark.parametrize(
    "args", [["--help"], ["list"], ["schema"], ["run", "rounds=0"], ["compare", "partition.alpha=0"]]
)
def test_commands_answer_without_torch(args):
    done = _fresh(
        "from typer.testing import CliRunner\nfrom fedge.cli import app\n"
        f"result = CliRunner().invoke(app, {args!r})\nprint(result.exit_code)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == [str(2 if "=" in args[-1] else 0), "[]"], done.stdout[-500:]


@pytest.mark.parametrize(
    "overrides",
    [
        ["rounds=0"],
        ["partition.alpha=-1"],
        ["colour=blue"],
        ["data.name=mnistt"],
        ["algorithm.name=fedavgg"],
        ["engine.executor=fast"],
        ["system.bandwidth_hz=nan"],
        ["stop.targets=[2]"],
    ],
)
def test_the_precheck_says_what_the_full_check_says(overrides):
    with pytest.raises(ConfigError) as full:
        fedge.resolve_config(None, overrides)
    with pytest.raises(ConfigError) as early:
        precheck(None, overrides)
    assert str(early.value) == str(full.value)


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_shipped_example_passes_the_precheck(name):
    precheck(f"example:{name}")


def test_the_algorithm_block_keys_are_left_to_the_full_check():
    precheck(None, ["algorithm.hh=2"])
    with pytest.raises(ConfigError, match="algorithm.hh: unknown key"):
        fedge.resolve_config(None, ["algorithm.hh=2"])


def test_the_precheck_knows_installed_plugins_by_their_entry_points(tmp_path, monkeypatch):
    info = tmp_path / "someplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: someplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fedge.algorithms]\nmyalgo = someplugin:Algo\n\n[fedge.datasets]\nmydata = someplugin:load\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    precheck(None, ["algorithm.name=myalgo", "data.name=mydata"])  # nothing imported: the module is absent


def test_the_custom_model_name_is_the_models_own():
    assert locate.CUSTOM_MODEL == models.CUSTOM
