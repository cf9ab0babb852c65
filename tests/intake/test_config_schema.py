"""A config that explains itself: `fedge list --algorithm`, `fedge schema`, descriptive keys with aliases."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

import fedge
from fedge.cli.commands import app

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def test_list_algorithm_prints_keys_types_defaults_and_descriptions():
    result = CliRunner().invoke(app, ["list", "--algorithm", "cse_fsl", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["key"]: row for row in json.loads(result.output)}
    assert rows["upload_every"]["aliases"] == ["h"] and rows["upload_every"]["default"] == 1
    assert rows["optimizer.kind"]["type"] == "'sgd' | 'adam'"
    assert rows["optimizer.lr"]["description"]


def test_list_algorithm_shows_the_algorithm_s_own_defaults_of_a_nested_block():
    result = CliRunner().invoke(app, ["list", "--algorithm", "afind", "--json"])
    rows = {row["key"]: row["default"] for row in json.loads(result.output)}
    assert rows["optimizer.lr"] == 0.01 and rows["optimizer.momentum"] == 0.9  # AFIND+'s paper optimizer


def test_list_algorithm_with_an_unknown_name_is_one_line_and_exit_2():
    result = CliRunner().invoke(app, ["list", "--algorithm", "cse_fs"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --algorithm: unknown algorithm 'cse_fs'; did you mean 'cse_fsl'?"
    ]


@pytest.mark.ci
def test_the_schema_accepts_every_example_and_rejects_a_misspelt_key(tmp_path):
    out = tmp_path / "fedge.schema.json"
    assert CliRunner().invoke(app, ["schema", "--out", str(out)]).exit_code == 0
    schema = json.loads(out.read_text())
    for path in EXAMPLES:
        jsonschema.validate(yaml.safe_load(path.read_text()) or {}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"algorithm": {"name": "cse_fsl", "upload_evry": 3}}, schema)


def test_a_descriptive_key_and_its_symbol_are_one_key():
    by_symbol = fedge.resolve_config({"algorithm": {"name": "cse_fsl", "h": 3, "l": 2}})
    by_name = fedge.resolve_config({"algorithm": {"name": "cse_fsl", "upload_every": 3, "server_every": 2}})
    assert by_symbol == by_name
    assert "upload_every: 3" in by_symbol.to_yaml()
    with pytest.raises(fedge.ConfigError, match="^algorithm.h: set twice"):
        fedge.resolve_config({"algorithm": {"name": "cse_fsl", "h": 2, "upload_every": 3}})


def test_every_key_of_every_built_in_block_has_a_description():
    from fedge.algorithms import ALGORITHMS
    from fedge.config import RunConfig, _blocks

    undescribed = {
        f"{block.__name__}.{name}"
        for top in (RunConfig, *(cls.config_class for cls in ALGORITHMS.values()))
        for block in _blocks(top)
        for name, field in block.model_fields.items()
        if not field.description
    }
    assert not undescribed, f"add a description (a docstring under the field): {sorted(undescribed)}"
