"""Device profiles: seeded draws, files of measured devices, availability traces, energy budgets, and
what the system model and the run directory make of them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cases import tiny

import fedge
import fedge.algorithms  # noqa: F401  (the algorithm configs the run config names)
from fedge.config import SystemConfig, parse_config
from fedge.errors import ConfigError
from fedge.system import SystemModel
from fedge.system.clock import RoundCost
from fedge.system.profiles import device_profiles


def system(devices: dict | None = None, **keys) -> SystemConfig:
    return SystemConfig.model_validate({**keys, "devices": devices})


def test_without_profiles_the_system_is_the_uniform_fleet_it_was():
    plain = SystemModel(system(), 8, seed=4)
    profiled = SystemModel(system({"availability": 1.0}), 8, seed=4)
    assert plain.profiles is None and plain.online(3).all()
    np.testing.assert_array_equal(plain.distances_m, profiled.distances_m)
    np.testing.assert_array_equal(plain.link(2).up_bps, profiled.link(2).up_bps)
    flops = np.full(8, 1e9)
    np.testing.assert_array_equal(
        plain.client_compute(flops, np.arange(8)).seconds,
        profiled.client_compute(flops, np.arange(8)).seconds,
    )


def test_ranges_draw_per_group_from_the_seed():
    cfg = system({"cpu_hz": [[1e9, 2e9], [2e9, 4e9]], "distance_m": [100, 300], "spread": "log"})
    one, two = device_profiles(cfg, 10, seed=1), device_profiles(cfg, 10, seed=1)
    np.testing.assert_array_equal(one.cpu_hz, two.cpu_hz)
    assert ((one.cpu_hz[:5] >= 1e9) & (one.cpu_hz[:5] <= 2e9)).all()  # HIST's halves
    assert ((one.cpu_hz[5:] >= 2e9) & (one.cpu_hz[5:] <= 4e9)).all()
    assert ((one.distance_m >= 100) & (one.distance_m <= 300)).all()
    other = device_profiles(cfg, 10, seed=2)
    assert not np.array_equal(one.cpu_hz, other.cpu_hz)


def test_compute_time_follows_each_clients_processor():
    model = SystemModel(system({"cpu_hz": [[1e8, 1e8], [1e9, 1e9]]}), 4, seed=0)
    seconds = model.client_compute(np.full(4, 1e9), np.arange(4)).seconds
    np.testing.assert_allclose(seconds, [10.0, 10.0, 1.0, 1.0])


def test_availability_is_drawn_per_round_and_a_budget_runs_out():
    model = SystemModel(system({"availability": 0.5, "energy_budget_j": 1.0}), 200, seed=0)
    online = np.array([model.online(t) for t in range(1, 21)])
    assert 0.4 < online.mean() < 0.6
    assert not np.array_equal(online[0], online[1])
    np.testing.assert_array_equal(model.online(5), online[4])  # the same round, the same draw
    model.clock.charge(RoundCost(0.0, 2.0, {}, {"client:3": {"client_compute": 2.0}}))
    assert not any(model.online(t)[3] for t in range(1, 21))  # out of energy: gone for good


def test_a_file_of_measured_devices_overrides_the_draws(tmp_path):
    path = tmp_path / "devices.csv"
    path.write_text("client,cpu_hz,energy_budget_j\n1,2e9,5\n0,1e9,7\n2,3e9,9\n")
    profiles = device_profiles(system({"file": str(path), "distance_m": 150}), 3, seed=0)
    np.testing.assert_array_equal(profiles.cpu_hz, [1e9, 2e9, 3e9])
    np.testing.assert_array_equal(profiles.energy_budget_j, [7, 5, 9])
    np.testing.assert_array_equal(profiles.distance_m, [150, 150, 150])
    as_json = tmp_path / "devices.json"
    as_json.write_text(json.dumps([{"client": i, "cpu_hz": 1e9 * (i + 1)} for i in range(3)]))
    np.testing.assert_array_equal(
        device_profiles(system({"file": str(as_json)}), 3, 0).cpu_hz, [1e9, 2e9, 3e9]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("client,cpu\n0,1\n1,1\n", "unknown column 'cpu'"),
        ("client,cpu_hz\n0,1e9\n", "has 1 of 2 clients"),
        ("client,cpu_hz\n0,1e9\n0,1e9\n", "client 0 appears twice"),
        ("client,cpu_hz\n0,fast\n1,1e9\n", "'fast' is not a number"),
        ("client,cpu_hz\n0,-1\n1,1e9\n", "cpu_hz must be positive"),
        ("client,availability\n0,1.5\n1,1\n", "availability is at most 1"),
        ("client,cpu_hz\n0,1e9\n5,1e9\n", "client 5 is not one of 0..1"),
    ],
)
def test_a_bad_profile_file_is_one_line_naming_the_key_and_the_file(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        device_profiles(system({"file": str(path)}), 2, seed=0)
    assert str(error.value).startswith("system.devices.file: ") and str(path) in str(error.value)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_trace_replaces_the_draws_round_by_round(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("c0,c1,c2\n1,0,1\n# a comment\n0,1,1\n")
    profiles = device_profiles(system({"trace": str(path), "availability": 0.1}), 3, seed=0)
    assert profiles.online(0, 1).tolist() == [True, False, True]
    assert profiles.online(0, 2).tolist() == [False, True, True]
    assert profiles.online(0, 3).tolist() == [True, False, True]  # cycled
    path.write_text("1,0\n")
    with pytest.raises(ConfigError, match=r"^system.devices.trace: .*line 1 is not 3 values of 0 or 1"):
        device_profiles(system({"trace": str(path)}), 3, seed=0)
    with pytest.raises(ConfigError, match=r"^system.devices.file: .*cannot be read"):
        device_profiles(system({"file": str(tmp_path / "missing.csv")}), 3, seed=0)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("availability", 1.5, "at most 1"),
        ("cpu_hz", [3e9, 1e9], "low <= high"),
        ("cpu_hz", [], "at least one range"),
        ("cpux", 1, "unknown key"),
    ],
)
def test_bad_device_keys_name_themselves(tmp_path, key, value, message):
    cfg = tiny("fedavg", tmp_path)
    cfg["system"] = {"devices": {key: value}}
    with pytest.raises(ConfigError, match=rf"^system\.devices\.{key}: .*{message}"):
        parse_config(cfg)


def test_the_run_directory_keeps_the_profiles(tmp_path):
    cfg = tiny("fedavg", tmp_path)
    cfg["system"] = {"devices": {"cpu_hz": [1e8, 1e9], "availability": 0.9}}
    result = fedge.run(cfg)
    lines = (result.run_dir / "devices.csv").read_text().splitlines()
    assert lines[0].startswith("client,cpu_hz,distance_m,bandwidth_hz") and len(lines) == 5
    cpu = [float(line.split(",")[1]) for line in lines[1:]]
    assert all(1e8 <= c <= 1e9 for c in cpu) and len(set(cpu)) == 4
    assert not (fedge.run({**tiny("fedavg", tmp_path / "plain")}).run_dir / "devices.csv").exists()


@pytest.mark.parametrize("none", ["", "inf", "Infinity", " INF "])
def test_a_blank_or_infinite_energy_budget_means_none(tmp_path, none):
    """A blank cell (or infinity) in ``energy_budget_j`` is a client without a budget; in JSON, null."""
    path = tmp_path / "devices.csv"
    path.write_text(f"client,energy_budget_j,cpu_hz\n0,5,1e9\n1,{none},1e9\n2,7,1e9\n")
    profiles = device_profiles(system({"file": str(path)}), 3, seed=0)
    np.testing.assert_array_equal(profiles.energy_budget_j, [5, np.inf, 7])
    as_json = tmp_path / "devices.json"
    as_json.write_text(json.dumps([{"client": i, "energy_budget_j": [5, None, 7][i]} for i in range(3)]))
    np.testing.assert_array_equal(
        device_profiles(system({"file": str(as_json)}), 3, 0).energy_budget_j, [5, np.inf, 7]
    )
    path.write_text("client,energy_budget_j,cpu_hz\n0,5,\n1,5,1e9\n2,7,1e9\n")  # blank elsewhere: no value
    with pytest.raises(ConfigError, match=r"row 1 cpu_hz: '' is not a number"):
        device_profiles(system({"file": str(path)}), 3, seed=0)


def test_a_client_without_a_budget_runs_beside_one_whose_budget_runs_out(tmp_path):
    path = tmp_path / "devices.csv"
    path.write_text("client,energy_budget_j\n0,1e-9\n1,\n2,inf\n3,\n")
    model = SystemModel(system({"file": str(path)}), 4, seed=0)
    model.clock.charge(RoundCost(0.0, 2.0, {}, {f"client:{i}": {"client_compute": 2.0} for i in range(4)}))
    assert model.online(2).tolist() == [False, True, True, True]
