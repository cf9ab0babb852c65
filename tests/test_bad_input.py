"""Every class of bad input from the robustness issue, through the command line: one line naming the key or
file, exit code 2, no run directory, and no warning or traceback on the way."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml
from cases import ALGORITHM_NAMES, check_outcome, invoke, read_only, tiny

from fedge import preflight


def refused(tmp_path: Path, algorithm: str, overrides: list[str], needle: str, **yaml_keys) -> str:
    """Run ``algorithm`` with ``overrides`` (and top-level YAML keys); assert the refusal; return its line."""
    out = tmp_path / "runs"
    config = {**tiny(algorithm, out), **yaml_keys}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome = invoke(["run", str(path), *overrides, "-q"])
    assert check_outcome(outcome, out) == "refused", outcome.output
    assert needle in outcome.lines[0], outcome.lines[0]
    return outcome.lines[0]


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_an_infinite_or_nan_step_size_is_refused_in_every_algorithm(tmp_path, algorithm):
    refused(
        tmp_path,
        algorithm,
        ["algorithm.optimizer.lr=.inf"],
        "algorithm.optimizer.lr: Input should be a finite",
    )
    refused(tmp_path, algorithm, ["algorithm.optimizer.lr=.nan"], "algorithm.optimizer.lr")


@pytest.mark.parametrize(
    ("algorithm", "override", "key"),
    [
        ("cse_fsl", "algorithm.global_lr=.inf", "algorithm.global_lr"),
        ("splitfed_v2", "algorithm.global_lr=-.inf", "algorithm.global_lr"),
        ("hist", "algorithm.radio.snr_db=[.nan,40]", "algorithm.radio.snr_db.0"),
        ("fedavg", "system.client_power_dbm=.nan", "system.client_power_dbm"),
        ("light_fedsl", "system.server_power_dbm=.inf", "system.server_power_dbm"),
        ("fedavg", "system.noise_dbm_per_hz=.inf", "system.noise_dbm_per_hz"),
        ("afind", "algorithm.dp.sigma=.inf", "algorithm.dp.sigma"),
        ("fedavg", "partition.alpha=.inf", "partition.alpha"),
    ],
)
def test_numbers_that_cannot_train_are_refused(tmp_path, algorithm, override, key):
    """Also: partition.alpha=.inf used to print a NumPy RuntimeWarning first (warnings are errors here)."""
    refused(tmp_path, algorithm, [override], f"{key}: Input should be a finite number")


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("a/b", "one folder name"),
        ("..", "one folder name"),
        ("/tmp/elsewhere", "one folder name"),
        ("a\x00b", "NUL"),
        ("x" * 300, "300 bytes long"),
        (".hidden", "must not start with '.'"),
        ("", "one folder name"),
    ],
)
def test_output_names_must_be_one_safe_folder_name(tmp_path, name, needle):
    out = tmp_path / "runs"
    line = refused(tmp_path, "fedavg", [], f"output.name: {''}", output={"dir": str(out), "name": name})
    assert needle in line


def test_output_dirs_that_cannot_hold_a_run(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    refused(tmp_path, "fedavg", [f"output.dir={a_file}"], f"output.dir: {a_file} is a file")
    refused(tmp_path, "fedavg", [f"output.dir={a_file}/below"], f"output.dir: {a_file} is a file")
    refused(tmp_path, "fedavg", ["output.dir=/dev/null/runs"], "output.dir: /dev/null is a file")
    refused(tmp_path, "fedavg", [], "output.dir: must not contain a NUL", output={"dir": "runs\x00x"})
    refused(
        tmp_path, "fedavg", [f"output.dir={tmp_path / ('y' * 300)}"], "output.dir: has a folder name longer"
    )
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):
        refused(tmp_path, "fedavg", [f"output.dir={locked}"], "output.dir:")
        refused(tmp_path, "fedavg", [f"output.dir={locked}/deeper/runs"], "output.dir:")
        assert list(locked.iterdir()) == []


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.batch_size=1e12", "algorithm.batch_size"),
        ("data.num_train=1e14", "data"),
        ("model.options.hidden=[1000000000000]", "model"),
        ("model.options.hidden=[1.0e12]", "model"),
        ("algorithm.local_epochs=1e14", "algorithm.local_epochs"),
    ],
)
def test_sizes_the_machine_cannot_hold_are_refused_before_allocating(tmp_path, override, key):
    line = refused(tmp_path, "fedavg", [override], f"{key}: this run needs about")
    assert "is available; --force runs it anyway" in line


def test_force_skips_the_memory_preflight(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 1024)
    refused(tmp_path, "fedavg", [], "but 1.0 KiB is available")
    out = tmp_path / "runs"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny("fedavg", out)))
    assert check_outcome(invoke(["run", str(path), "--force", "-q"]), out) == "finished"


@pytest.mark.parametrize(
    ("algorithm", "overrides", "needle"),
    [
        ("cse_fsl", ["algorithm.h=1000"], "algorithm.h: h=1000 but no client has more than"),
        ("pens", ["algorithm.keep=20"], "algorithm.keep:"),
        ("pens", ["algorithm.candidates=3"], "algorithm.keep: keeps 5 of 3 candidates"),
        ("afind", ["algorithm.k0=2", "algorithm.k_min=5"], "algorithm.k_min: is above k0=2"),
        ("ditto", ["algorithm.afind.k0=2", "algorithm.afind.k_min=3"], "algorithm.afind.k_min"),
        ("hist", ["model.options.hidden=[]"], "model: HIST partitions hidden fully connected layers"),
        ("fedavg", ["rounds=true"], "rounds: expected a number, got true"),
        ("fedavg", ["algorithm.optimizer.lr=false"], "algorithm.optimizer.lr: expected a number"),
        ("fedavg", ["data.shape=[1,true,6]"], "data.shape: expected a number"),
        ("fedavg", ["rounds=1e300"], "rounds: is too large"),
        ("fedavg", ["algorithm.batch_size=2.5"], "algorithm.batch_size: Input should be a valid integer"),
        ("fedavg", ["engine.threads=1e15"], "engine.threads: Input should be less than or equal to 1024"),
        ("fedavg", ["engine.device=meta"], "engine.device: 'meta' is not supported"),
        ("splitfed_v1", ["algorithm.aggregate_divisor=all_clients"], "all_clients needs aggregation=uniform"),
        ("fedavg", ["system.distance_min_m=500"], "system.distance_max_m: must be >= system.distance_min_m"),
    ],
)
def test_contradictions_are_refused_before_any_directory(tmp_path, algorithm, overrides, needle):
    refused(tmp_path, algorithm, overrides, needle)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("rounds: 3\noutput:\n  name: café\n".encode("latin-1"), "is not UTF-8 text"),
        ("rounds: 3\n".encode("utf-16"), "is not UTF-8 text"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not UTF-8 text"),
        (b"rounds: [1, 2\n", "not valid YAML"),
        (b"- just\n- a list\n", "a config file must hold a mapping"),
    ],
)
def test_unreadable_config_files_are_one_line(tmp_path, content, needle):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    outcome = invoke(["run", str(path), f"output.dir={tmp_path / 'runs'}", "-q"])
    assert check_outcome(outcome, tmp_path / "runs") == "refused"
    assert outcome.lines[0].startswith(f"error: {path}: {needle}"), outcome.lines[0]


def test_utf8_with_a_byte_order_mark_is_read(tmp_path):
    out = tmp_path / "runs"
    path = tmp_path / "config.yaml"
    path.write_bytes(yaml.safe_dump(tiny("fedavg", out, rounds=1)).encode("utf-8-sig"))
    assert check_outcome(invoke(["run", str(path), "-q"]), out) == "finished"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("algorithm.local_epoch=2", "algorithm.local_epoch: unknown key; did you mean 'local_epochs'?"),
        ("algorithm.optimizer.momentun=0.9", "did you mean 'momentum'?"),
        ("partition.alhpa=0.3", "partition.alhpa: unknown key; did you mean 'alpha'?"),
        ("algorithm.name=fedavgg", "unknown algorithm 'fedavgg'; did you mean 'fedavg'?"),
        ("zzz=1", "zzz: unknown key; valid keys here: seed, rounds,"),
        ("[bold]x=1", "[bold]x: unknown key"),
        ("a\nb=1", "a\\nb: unknown key"),
    ],
)
def test_unknown_keys_suggest_the_nearest_and_stay_on_one_line(tmp_path, override, needle):
    refused(tmp_path, "fedavg", [override], needle)
