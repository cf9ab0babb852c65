"""Answers in a fraction of a second: a config is validated, and --help, list and schema answer, before
torch or scikit-learn is imported (each checked in a fresh interpreter, whose sys.modules tells)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import parametrize_first_by_default

import fedge
from fedge import extend, models
from fedge.config import apply_override, parse_config
from fedge.errors import ConfigError
from fedge.intake import catalog, locate
from fedge.intake.precheck import known_names, precheck

ENV = {**os.environ, "PYTHONPATH": str(Path(fedge.__file__).parents[1])}
EXAMPLES = sorted(p.stem for p in locate.examples_dir().glob("*.yaml"))


def _fresh(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter; it must end by printing the heavy modules it imported."""
    heavy = "print(sorted(m for m in ('torch', 'sklearn') if m in sys.modules))"
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\n{heavy}"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_validation_imports_neither_torch_nor_sklearn():
    done = _fresh(
        "from fedge.errors import ConfigError\n"
        "from fedge.intake.precheck import precheck\n"
        "precheck('example:split-mnist', ['rounds=3', 'algorithm.h=2'])\n"
        "try:\n    precheck(None, ['rounds=0'])\nexcept ConfigError as e:\n    print(e)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["rounds: Input should be greater than 0 (got 0)", "[]"]


@parametrize_first_by_default(
    "args",
    [
        ["--help"],
        ["list"],
        ["list", "--algorithm", "cse_fsl"],
        ["schema"],
        ["run", "rounds=0"],
        ["run", "algorithm.hh=2"],
        ["compare", "partition.alpha=0"],
        ["sweep", "algorithm.batch_size=0"],
        ["bounds", "example:cse-cifar10", "algorithm.hh=2"],
    ],
)
def test_commands_answer_without_torch(args):
    done = _fresh(
        "from typer.testing import CliRunner\nfrom fedge.cli.commands import app\n"
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


def _mutations() -> list[tuple[str, str]]:
    """One bad value per key the schema bounds or restricts, a wrong type, and a misspelt key, for each
    key of each built-in algorithm (a key many algorithms share alike, once): (algorithm, override)."""
    defs = catalog.load_schema()["$defs"]
    cases, seen = [], set()
    for title, block in defs.items():
        if not title.startswith("algorithm:"):
            continue
        name = title.removeprefix("algorithm:")
        for key, prop in block["properties"].items():
            options = prop.get("anyOf", [prop])
            shape = (key, json.dumps(prop, sort_keys=True))
            if key == "name" or shape in seen:
                continue
            seen.add(shape)
            cases.append((name, f"algorithm.{key}x=1"))
            for option in options:
                if "enum" in option:
                    cases.append((name, f"algorithm.{key}=not_a_choice"))
                if "exclusiveMinimum" in option or "minimum" in option:
                    bound = option.get("exclusiveMinimum", option.get("minimum"))
                    cases.append((name, f"algorithm.{key}={bound - 1}"))
                if "maximum" in option or "exclusiveMaximum" in option:
                    bound = option.get("maximum", option.get("exclusiveMaximum"))
                    cases.append((name, f"algorithm.{key}={bound + 1}"))
                if option.get("type") in ("integer", "number", "boolean"):
                    cases.append((name, f"algorithm.{key}=[abc]"))
                if "$ref" in option:
                    cases.append((name, f"algorithm.{key}.nokey=1"))
    return cases


MUTATIONS = _mutations()


@pytest.mark.ci
def test_the_precheck_checks_the_algorithm_block_as_the_full_check_does():
    """Every mutation the schema can tell is refused early with the full check's very words; none that the
    full check admits is refused early."""
    names = known_names()
    caught = 0
    for name, override in MUTATIONS:
        raw = {"algorithm": {"name": name}}
        apply_override(raw, override)
        try:
            extend.parse_config(copy.deepcopy(raw))
            full = None
        except ConfigError as error:
            full = str(error)
        try:
            parse_config(raw, names)
            early = None
        except ConfigError as error:
            early = str(error)
        assert early is None or early == full, (override, early, full)
        caught += early is not None
    assert len(MUTATIONS) > 200
    assert caught == len(MUTATIONS)


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
