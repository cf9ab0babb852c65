"""Device profiles (``system.devices``) in the hierarchical family: a profile's processor speeds, bands,
distances and shadowing reach HIST's and HFedAvg's clock; a profile at HIST's own values changes nothing."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from cases import small_hist
from tiers import parametrize_first_by_default

from fedge.config import parse_config
from fedge.rng import numpy_rng
from fedge.runner.loop import build_run
from fedge.system.channel import path_loss_db
from fedge.system.oma import complex_gaussian

HIST_CPU_HALVES = [[1e9, 2e9], [2e9, 4e9]]  # the docs' HIST setting as a profile


@pytest.fixture
def raw(tmp_path) -> dict:
    return small_hist(tmp_path, 2)


def run(raw: dict, devices: dict | None = None, **algorithm) -> tuple[list[dict], object]:
    """The metrics of two rounds and the algorithm, with ``devices`` as the profile."""
    raw = copy.deepcopy(raw)
    raw["algorithm"].update(algorithm)
    if devices is not None:
        raw["system"] = {"devices": devices}
    built = build_run(parse_config(raw))
    alg = built.algorithm
    rows = []
    for t in (1, 2):
        report = alg.run_round(t)
        clock = alg.ctx.system.clock
        rows.append({**report.row(), "seconds": clock.seconds, "joules": clock.joules})
    return rows, alg


CASES = [{"name": "hist"}, {"name": "hist", "aggregation": "aircomp"}, {"name": "hfedavg"}]


@parametrize_first_by_default("algorithm", CASES)
def test_faster_processors_give_a_shorter_round(raw, algorithm):
    plain, _ = run(raw, **algorithm)
    halves, alg = run(raw, {"cpu_hz": HIST_CPU_HALVES}, **algorithm)
    fast, _ = run(raw, {"cpu_hz": 1e11}, **algorithm)
    slow, _ = run(raw, {"cpu_hz": 1e8}, **algorithm)
    np.testing.assert_array_equal(alg.radio.cpu_hz(1), alg.ctx.system.profiles.cpu_hz)  # the profile's
    assert halves[-1]["seconds"] != plain[-1]["seconds"]  # HIST's draws per round, the profile once
    assert fast[-1]["seconds"] < plain[-1]["seconds"] < slow[-1]["seconds"]
    assert fast[-1]["joules"] > plain[-1]["joules"] > slow[-1]["joules"]  # kappa f^2 per cycle
    assert [r["train_loss"] for r in fast] == [r["train_loss"] for r in plain]  # the clock only


@parametrize_first_by_default("algorithm", CASES)
def test_a_profile_at_the_radios_own_values_changes_no_number(raw, algorithm):
    """The radio's band, a client at the middle of the system's distances (100-300 m), no shadowing."""
    plain, _ = run(raw, **algorithm)
    same, _ = run(
        raw,
        {"bandwidth_hz": 9e6, "distance_m": 200.0, "shadowing_db": 0.0, "availability": 1.0},
        **algorithm,
    )
    assert same == plain


def test_the_oma_rate_follows_each_clients_band_distance_and_shadowing(raw):
    devices = {"bandwidth_hz": [[3e6, 3e6], [9e6, 9e6]], "distance_m": [120, 280], "shadowing_db": [0, 6]}
    _, alg = run(raw, devices)
    profiles, radio = alg.ctx.system.profiles, alg.cfg.radio
    channels = complex_gaussian(numpy_rng(5, "hist-oma-channel", 1), (8, radio.antennas))
    snr = 10 ** (np.repeat(radio.snr_db, 4) / 10)  # cell 0 at 30 dB, cell 1 at 40 dB
    loss_db = path_loss_db(profiles.distance_m) - path_loss_db(200.0) + profiles.shadowing_db
    snr = snr * radio.bandwidth_hz / profiles.bandwidth_hz * 10 ** (-loss_db / 10)
    expected = profiles.bandwidth_hz * np.log2(1 + snr * np.sum(np.abs(channels) ** 2, axis=1))
    np.testing.assert_allclose(alg.radio.oma_rates(1), expected, rtol=1e-12)


@parametrize_first_by_default("aggregation", ["oma", "aircomp"])
def test_a_narrow_band_or_a_far_client_slows_the_uplink(raw, aggregation):
    plain, _ = run(raw, aggregation=aggregation)
    narrow, alg = run(raw, {"bandwidth_hz": [1e6, 3e6]}, aggregation=aggregation)
    far, _ = run(raw, {"distance_m": 1000.0, "shadowing_db": 10.0}, aggregation=aggregation)
    assert narrow[-1]["seconds"] > plain[-1]["seconds"]
    if aggregation == "aircomp":  # one band per cell: its narrowest client's
        bands = alg.ctx.system.profiles.bandwidth_hz.reshape(2, 4).min(axis=1)
        np.testing.assert_array_equal(alg.radio.cell_bandwidth_hz(), bands)
        assert far[-1]["aircomp_mse"] > plain[-1]["aircomp_mse"]  # weaker channels, noisier estimate
    else:
        assert far[-1]["seconds"] > plain[-1]["seconds"]


def test_a_profile_file_gives_the_processors(raw, tmp_path):
    path = tmp_path / "devices.csv"
    path.write_text("client,cpu_hz\n" + "".join(f"{i},{(i + 1) * 1e9}\n" for i in range(8)))
    _, alg = run(raw, {"file": str(path)})
    np.testing.assert_array_equal(alg.radio.cpu_hz(2), np.arange(1, 9) * 1e9)
    np.testing.assert_array_equal(alg.radio.oma_rates(1), run(raw)[1].radio.oma_rates(1))  # radio untouched
