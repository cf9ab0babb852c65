"""Every class of bad input from the robustness issue, through the command line: one line naming the key or
file, exit code 2, no run directory, and no warning or traceback on the way."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cases import ALGORITHM_NAMES, check_outcome, invoke, read_only, tiny
from tiers import parametrize_first_by_default

from fedge.errors import ConfigError
from fedge.runner import preflight


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


@parametrize_first_by_default("algorithm", ALGORITHM_NAMES)
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


@parametrize_first_by_default(
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


# ----- files a run reads: device profiles, availability traces, text data -----------------------------


@contextlib.contextmanager
def fifo(path: Path) -> Iterator[Path]:
    """A FIFO at ``path``; should a reader block on it (the defect), a writer opens and closes it after a
    few seconds so that the test fails instead of hanging."""
    os.mkfifo(path)
    done = threading.Event()

    def unblock() -> None:
        if done.wait(15):
            return
        while not done.is_set():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader yet
                time.sleep(0.1)

    threading.Thread(target=unblock, daemon=True).start()
    try:
        yield path
    finally:
        done.set()


def refused_run(tmp_path: Path, config: dict, needle: str) -> str:
    """``fedge run`` on ``config`` (output under ``tmp_path/runs``) refused in one line holding ``needle``."""
    out = tmp_path / "runs"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**config, "output": {"dir": str(out), "plots": False}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome = invoke(["run", str(path), "-q"])
    assert check_outcome(outcome, out) == "refused", outcome.output
    assert needle in outcome.lines[0], outcome.lines[0]
    return outcome.lines[0]


def with_devices(tmp_path: Path, algorithm: str = "fedavg", **devices) -> dict:
    config = tiny(algorithm, tmp_path / "runs")
    config["system"] = {"devices": {key: str(value) for key, value in devices.items()}}
    return config


def text_run(root: Path, **data) -> dict:
    """A tiny language-model run on the text files of ``root``."""
    config = tiny("fedavg", root)
    config["data"] = {"name": "text", "root": str(root), "seq_len": 16, **data}
    config["partition"] = {"kind": "iid", "num_clients": 2}
    config["model"] = {"name": "gpt2", "options": {"layers": 1, "hidden": 16, "heads": 2}}
    return config


@pytest.mark.parametrize("key", ["file", "trace"])
def test_a_fifo_as_a_profile_file_or_trace_is_refused_without_waiting(tmp_path, key):
    with fifo(tmp_path / "devices.csv") as path:
        refused_run(
            tmp_path, with_devices(tmp_path, **{key: path}), f"system.devices.{key}: {path}: is not a regular"
        )


def test_a_device_file_is_refused_as_no_regular_file(tmp_path):
    refused_run(
        tmp_path, with_devices(tmp_path, file="/dev/zero"), "system.devices.file: /dev/zero: is not a regular"
    )
    link = tmp_path / "trace.csv"
    link.symlink_to("/dev/zero")
    refused_run(
        tmp_path, with_devices(tmp_path, trace=link), f"system.devices.trace: {link}: is not a regular file"
    )


@pytest.mark.parametrize("key", ["file", "trace"])
def test_a_profile_file_past_the_size_cap_is_refused_unread(tmp_path, key):
    path = tmp_path / "devices.csv"
    with path.open("wb") as handle:  # sparse: 2 GiB on paper, nothing on disk
        handle.truncate(2**31)
    line = refused_run(
        tmp_path, with_devices(tmp_path, **{key: path}), f"system.devices.{key}: {path}: is 2,048 MiB"
    )
    assert "at most" in line


def test_a_small_size_cap_applies_to_profile_files(tmp_path, monkeypatch):
    from fedge.system import profiles

    monkeypatch.setattr(profiles, "MAX_FILE_BYTES", 64)
    path = tmp_path / "devices.csv"
    path.write_text("client,cpu_hz\n" + "".join(f"{i},1e9\n" for i in range(4)) + "#" * 64)
    refused_run(tmp_path, with_devices(tmp_path, file=path), f"system.devices.file: {path}: is ")


def test_a_fifo_in_a_text_folder_is_refused_without_waiting(tmp_path):
    root = tmp_path / "text"
    root.mkdir()
    (root / "a.txt").write_text("the cut layer client server token " * 20)
    with fifo(root / "b.txt") as path:
        refused_run(tmp_path, text_run(root), f"data.root: {path}: is not a regular file (a FIFO)")


@pytest.mark.parametrize("name", ["femnist", "shakespeare"])
def test_a_fifo_among_leaf_json_files_is_refused_without_waiting(tmp_path, name):
    from fedge.config import DataConfig
    from fedge.data.sources import load_dataset
    from fedge.errors import DataError

    for split in ("train", "test"):
        (tmp_path / split).mkdir()
    refusal = pytest.raises((ConfigError, DataError), match=r"part_0.json: is not a regular file \(a FIFO\)")
    with fifo(tmp_path / "train" / "part_0.json") as path, refusal:
        load_dataset(DataConfig(name=name, root=tmp_path, seq_len=8), seed=0)
    assert path.exists()


def test_a_text_file_past_the_size_cap_is_refused_unread(tmp_path, monkeypatch):
    from fedge.data.sources import text

    root = tmp_path / "text"
    root.mkdir()
    (root / "a.txt").write_text("the cut layer client server token " * 20)
    with (root / "b.txt").open("wb") as handle:
        handle.truncate(2**31)
    refused_run(tmp_path, text_run(root), f"data.root: {root / 'b.txt'}: is 2,048 MiB")
    monkeypatch.setattr(text, "MAX_TEXT_BYTES", 64)
    (root / "b.txt").unlink()
    (root / "b.jsonl").write_text('{"text": "the cut layer"}\n' * 10)  # read whole: past the cap
    refused_run(tmp_path, text_run(root, text_bytes=32), f"data.root: {root / 'b.jsonl'}: is ")


@parametrize_first_by_default("value", ["null", "3", '["a"]', '{"a": 1}', "true"])
def test_a_jsonl_text_that_is_no_string_is_refused(tmp_path, value):
    root = tmp_path / "text"
    root.mkdir()
    (root / "a.txt").write_text("the cut layer client server token " * 20)
    (root / "b.jsonl").write_text(f'{{"text": "the cut layer client server token"}}\n{{"text": {value}}}\n')
    refused_run(tmp_path, text_run(root), f"{root / 'b.jsonl'}:2: 'text' must be a string")
    config = text_run(root)
    config["data"]["name"] = "textcls"
    config["model"] = {"name": "bert", "options": {"layers": 1, "hidden": 16, "heads": 2}}
    refused_run(tmp_path, config, f"{root / 'b.jsonl'}:2: 'text' must be a string")


@parametrize_first_by_default(
    ("text", "needle"),
    [
        ("client,cpu_hz\n0,1e9,5\n1,1e9\n2,1e9\n3,1e9\n", "row 1 has 3 cells, the header 2"),
        ("client,cpu_hz\n0,1e9\n1\n2,1e9\n3,1e9\n", "row 2 has 1 cell, the header 2"),
        (
            "client,cpu_hz,cpu_hz\n0,1e9,2e9\n1,1e9,1e9\n2,1e9,1e9\n3,1e9,1e9\n",
            "column 'cpu_hz' appears twice",
        ),
        ("client,cpu_hz\n0,5e-324\n1,1e9\n2,1e9\n3,1e9\n", "cpu_hz must be between 1 and 1e+15"),
        ("client,bandwidth_hz\n0,1e-300\n1,1\n2,1\n3,1\n", "bandwidth_hz must be between 1 and 1e+12"),
        ("client,distance_m\n0,1e-300\n1,1\n2,1\n3,1\n", "distance_m must be between 1 and 1e+07"),
        ("client,shadowing_db\n0,1e300\n1,1\n2,1\n3,1\n", "shadowing_db must be between"),
        ("client,cpu_hz\n" + "9" * 5000 + ",1e9\n1,1e9\n2,1e9\n3,1e9\n", "row 1 client: '99999"),
        ("client,cpu_hz\n0,\n1,1e9\n2,1e9\n3,1e9\n", "row 1 cpu_hz: '' is not a number"),
        ("client,energy_budget_j\n0,-inf\n1,1\n2,1\n3,1\n", "energy_budget_j must be positive"),
    ],
    ids=[
        "extra-cell",
        "short-row",
        "duplicate-column",
        "denormal-cpu",
        "tiny-bandwidth",
        "tiny-distance",
        "huge-shadowing",
        "5000-digit-client",
        "blank-cpu",
        "negative-budget",
    ],  # fmt: skip
)
def test_a_malformed_device_csv_is_refused_in_one_line(tmp_path, text, needle):
    assert_device_file_refused(tmp_path / "devices.csv", text, needle)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('[{"client": ' + "9" * 5000 + ', "cpu_hz": 1e9}]', "row 1 client"),
        ('[{"client": 0, "cpu_hz": ' + "9" * 5000 + "}]", "row 1 cpu_hz"),
        ('[{"client": 0, "cpu_hz": null}]', "row 1 cpu_hz: null is not a number"),
        ('[{"client": 0, "cpu_hz": [1]}]', "row 1 cpu_hz: [1] is not a number"),
    ],
    ids=["deep", "5000-digit-client", "5000-digit-cpu", "null-cpu", "list-cpu"],
)
def test_a_malformed_device_json_is_refused_in_one_line(tmp_path, text, needle):
    assert_device_file_refused(tmp_path / "devices.json", text, needle)


def assert_device_file_refused(path: Path, text: str, needle: str) -> None:
    """A run whose device-profile file holds ``text`` fails in one short line naming it and ``needle``."""
    path.write_text(text)
    line = refused_run(path.parent, with_devices(path.parent, file=path), f"system.devices.file: {path}: ")
    assert needle in line and len(line) < 400, line


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("system.devices.bandwidth_hz=1e-300", "system.devices.bandwidth_hz"),
        ("system.devices.cpu_hz=5e-324", "system.devices.cpu_hz"),
        ("system.devices.cpu_hz=[1e-300,1e9]", "system.devices.cpu_hz"),
        ("system.devices.distance_m=1e-300", "system.devices.distance_m"),
        ("system.devices.distance_m=1e300", "system.devices.distance_m"),
        ("system.devices.shadowing_db=-1e300", "system.devices.shadowing_db"),
        ("system.devices.energy_budget_j=1e-320", "system.devices.energy_budget_j"),
    ],
)
def test_physically_meaningless_device_figures_are_refused(tmp_path, override, key):
    refused(tmp_path, "fedavg", [override], f"{key}: ")


@pytest.mark.parametrize(
    "override",
    [
        "algorithm.radio.bandwidth_hz=1e-300",
        "algorithm.radio.cpu_ghz=[[5e-324,5e-324]]",
        "algorithm.radio.subcarrier_hz=1e-300",
        "algorithm.radio.symbol_s=1e-320",
        "algorithm.radio.cycles_per_step=1e-300",
        "algorithm.radio.snr_db=[1e300,40]",
    ],
)
def test_physically_meaningless_hist_radio_figures_are_refused(tmp_path, override):
    """A denormal CPU frequency made HIST's round time infinite (exit 3 after a NumPy warning)."""
    refused(tmp_path, "hist", [override], f"{override.split('=')[0]}")


def test_a_peer_count_no_client_can_have_is_refused(tmp_path):
    line = refused(tmp_path, "gossip", ["algorithm.peers=4"], "algorithm.peers: ")
    assert "of 4 clients each has 3 others" in line


def test_a_llama_whose_key_value_heads_do_not_divide_its_heads_is_refused(tmp_path):
    root = tmp_path / "text"
    root.mkdir()
    (root / "a.txt").write_text("the cut layer client server token " * 20)
    config = text_run(root)
    config["model"] = {"name": "llama", "options": {"layers": 1, "hidden": 24, "heads": 3, "kv_heads": 2}}
    refused_run(tmp_path, config, "model.options.kv_heads: heads 3 is not a multiple of kv_heads 2")


def test_a_model_too_large_to_build_is_refused_from_its_options(tmp_path):
    """Checked from the options alone: 100,000 layers kept the pre-flight's meta-device build busy for
    39 minutes; weights beyond all memory are refused before any tensor exists."""
    from fedge.models.registry import validate_options

    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^model.options.layers: 100,000 layers: .* at most 1,024"):
        validate_options("gpt2", {"layers": 100_000, "hidden": 32})
    with pytest.raises(ConfigError, match=r"^model.options.layers: "):
        validate_options("llama", {"layers": 10**9})
    with pytest.raises(
        ConfigError, match=r"^model.options.hidden: at least .* GiB as float32\), more than all"
    ):
        validate_options("bert", {"hidden": 2**30, "heads": 1})
    with pytest.raises(ConfigError, match=r"^model.options.intermediate: at least "):
        validate_options("llama", {"intermediate": 2**50})
    assert time.perf_counter() - started < 1.0
    assert validate_options("gpt2", {"layers": 4, "hidden": 32}) == {"layers": 4, "hidden": 32}
    assert validate_options("gpt2", {"layers": 100_000, "pretrained": "a-folder"})["layers"] == 100_000
    root = tmp_path / "text"
    root.mkdir()
    (root / "a.txt").write_text("the cut layer client server token " * 20)
    config = text_run(root)
    config["model"]["options"]["layers"] = 100_000
    refused_run(tmp_path, config, "model.options.layers: 100,000 layers")
