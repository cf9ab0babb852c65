"""``fedge bounds``: one setting, sweeps, run configs with estimated constants, and one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedge.cli.commands import app
from fedge.config import load_config, split_values

runner = CliRunner()
EXAMPLES = Path(__file__).parents[2] / "examples" / "theory"


def bounds_json(*args: str) -> list[dict]:
    result = runner.invoke(app, ["bounds", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def by_name(entry: dict) -> dict[str, dict]:
    return {b["name"]: b for b in entry["bounds"]}


def test_the_unit_setting_prints_its_golden_values():
    result = runner.invoke(app, ["bounds"])
    assert result.exit_code == 0 and "sfl.thm1" in result.output and "0.979" in result.output
    (entry,) = bounds_json("theory.n=5")
    assert by_name(entry)["sfl.thm2.corrected"]["value"] == pytest.approx(0.270471, rel=1e-5)
    assert by_name(entry)["sfl.thm4.stated"]["value"] == pytest.approx(0.452778, rel=1e-5)


def test_a_sweep_is_a_grid_and_flags_vacuous_points():
    entries = bounds_json("--sweep", "theory.K=1,8", "--sweep", "theory.l=1,2")
    assert [e["sweep"] for e in entries] == [
        {"theory.K": k, "theory.l": l}
        for k in ("1", "8")
        for l in ("1", "2")  # noqa: E741
    ]
    first = by_name(entries[0])["sfl.thm1"]
    assert first["vacuous"] and math.isinf(first["value"]) and "Gamma*lam2" in first["reason"]
    assert by_name(entries[2])["sfl.thm1"]["value"] == pytest.approx(887.692, rel=1e-5)
    table = runner.invoke(app, ["bounds", "theory.l=1", "--sweep", "theory.K=1,8"])
    assert table.exit_code == 0 and "inf" in table.output and "887.7" in table.output


def test_sweep_values_split_outside_brackets():
    assert split_values("[1,2],[3], 4") == ["[1,2]", "[3]", "4"]


@pytest.mark.parametrize("name", ["sfl-p1", "cse-fsl", "light-fedsl", "hist"])
def test_every_theory_example_evaluates(name):
    (entry,) = bounds_json(str(EXAMPLES / f"{name}.yaml"))
    assert entry["bounds"] and all(not b["vacuous"] for b in entry["bounds"])
    assert (
        entry["inputs"]["paper"] == yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["theory"]["paper"]
    )


@pytest.mark.ci
def test_the_digits_example_is_a_run_config_whose_constants_are_estimated():
    config = load_config(EXAMPLES / "digits-cse-fsl.yaml")
    assert config.algorithm.name == "cse_fsl" and config.algorithm.server_every == 2
    small = ("rounds=5", "partition.num_clients=4", "--probe", "24")
    (entry,) = bounds_json(str(EXAMPLES / "digits-cse-fsl.yaml"), *small)
    inputs = entry["inputs"]
    assert (inputs["T"], inputs["K"], inputs["l"], inputs["m"], inputs["n"]) == (5, 5, 2, 4, None)
    assert inputs["mu_L"] == 0.05 and inputs["mu"] == 0.05 and inputs["sides"] == "both"
    assert inputs["L"] > 0 and inputs["sigma_G2"] > 0 and 0 < inputs["delta_F"] < 5
    assert set(by_name(entry)) == {"sfl.thm1", "sfl.thm3"}
    assert all(b["vacuous"] for b in entry["bounds"])  # practical steps are far above the caps


def test_a_fedavg_run_config_gives_the_client_side_only(tiny_config, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**tiny_config, "theory": {"mu_L": "max"}}))
    (entry,) = bounds_json(str(path), "algorithm.fraction=0.4")
    inputs = entry["inputs"]
    assert inputs["n"] == 2 and inputs["m"] == 5 and inputs["T"] == 4 and inputs["sides"] == "client"
    assert "mu" not in inputs and set(by_name(entry)) == {"sfl.thm2.corrected", "sfl.thm2.stated"}
    assert not by_name(entry)["sfl.thm2.corrected"]["reason"].startswith("client step")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["theory.K=0"], "theory.K"),
        (["theory.colour=blue"], "theory.colour"),
        (["theory.paper=fedprox"], "theory.paper"),
        (["theory.mu_L=fast"], "theory.mu_L"),
        (["--sweep", "theory.K"], "--sweep"),
        (["theory.paper=hist"], "theory.E"),
        ([str(EXAMPLES / "hist.yaml"), "theory.clients_per_cell=[3,4,5]"], "theory.clients_per_cell"),
        ([str(EXAMPLES / "light-fedsl.yaml"), "theory.G2=[1]"], "theory.G2"),
        (["missing.yaml"], "missing.yaml"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_key(args, needle):
    result = runner.invoke(app, ["bounds", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output


def test_a_split_algorithm_with_returned_gradients_is_refused(tiny_config, tmp_path):
    config = {**tiny_config, "model": {"name": "mlp", "cut": 1, "options": {"hidden": [8]}}}
    config["algorithm"] = {"name": "splitfed_v1", "batch_size": 16}
    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["bounds", str(path)])
    assert result.exit_code == 2 and "algorithm.name" in result.output
