"""AirComp's receiver noise accounted as a Gaussian mechanism (fedge.privacy.air) in tiny HIST runs."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cases import tiny

import fedge
from fedge.algorithms.hierarchical.hierarchy import HierarchicalFL
from fedge.config import RunConfig
from fedge.errors import ConfigError
from fedge.privacy.air import aircomp_noise_multiplier, aircomp_noise_std, aircomp_releases
from fedge.rng import numpy_rng
from fedge.runner.loop import build_run
from fedge.system.aircomp import aircomp_mse, aircomp_receive, min_gain, receive_beamformer
from fedge.system.oma import complex_gaussian, db_to_linear


def air_run(out: Path, snr_db: float, clip: float | None = 0.5, name: str = "hist", **radio: Any) -> dict:
    """A 2-round HIST run of 4 clients in 2 cells, AirComp at ``snr_db``, 2 edge rounds."""
    config = tiny(name, out)
    config["algorithm"].update(
        aggregation="aircomp", edge_rounds=2, radio={"snr_db": [snr_db], "antennas": 3, **radio}
    )
    if clip is not None:
        config["algorithm"]["radio"]["clip"] = clip
    return config


def releases(result: fedge.Result) -> list[dict[str, str]]:
    with open(result.run_dir / "privacy.csv") as handle:
        return list(csv.DictReader(handle))


def hand_multiplier(
    seed: int, t: int, e: int, cell: int, snr_db: float, clip: float, real_part: bool
) -> float:
    """z from the round's own channel draws: h ~ CN(0, I_3) per client, the max-min beamformer a, Eq. 25's
    MSE = 1 / (SNR min_i |a^H h_i|^2), std = sqrt(MSE) (or sqrt(MSE / 2)), z = std / (clip / n_j)."""
    channels = complex_gaussian(numpy_rng(seed, "hist-aircomp-channel", t, e, cell), (2, 3))
    beamformer = receive_beamformer(channels, numpy_rng(seed, "hist-beamformer", t, e, cell), restarts=4)
    gain = float(np.min(np.abs(np.conj(beamformer) @ channels.T) ** 2))
    mse = 1.0 / (float(db_to_linear(snr_db)) * gain)
    std = math.sqrt(mse / 2 if real_part else mse)
    return std / (clip / 2)


@pytest.mark.parametrize("noise_model", ["paper", "real_part"])
def test_recorded_multiplier_is_the_rounds_channel_noise_over_the_sensitivity(
    tmp_path: Path, noise_model: str
) -> None:
    result = fedge.run(air_run(tmp_path, 10.0, clip=0.5, noise_model=noise_model))
    rows = releases(result)
    assert len(rows) == 2 * 2 * 2  # rounds x edge rounds x cells
    by_cell: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        assert (row["kind"], row["unit"], row["mechanism"]) == ("aircomp", "client", "gaussian")
        assert float(row["clip"]) == pytest.approx(0.5 / 2)  # the sensitivity of a cell mean of 2
        by_cell.setdefault((int(row["round"]), row["clients"]), []).append(float(row["noise_multiplier"]))
    assert sorted(by_cell) == [(t, c) for t in (1, 2) for c in ("0 1", "2 3")]
    for (t, clients), found in by_cell.items():
        cell = int(clients.split()[0]) // 2
        expected = [hand_multiplier(3, t, e, cell, 10.0, 0.5, noise_model == "real_part") for e in range(2)]
        assert found == pytest.approx(expected, rel=1e-9)


def test_higher_snr_spends_more_epsilon(tmp_path: Path) -> None:
    low = fedge.run(air_run(tmp_path / "low", -20.0)).summary["privacy"]["epsilon"]
    high = fedge.run(air_run(tmp_path / "high", 10.0)).summary["privacy"]["epsilon"]
    assert 0 < low < high < math.inf


def test_hfedavg_over_the_air_is_accounted_too(tmp_path: Path) -> None:
    summary = fedge.run(air_run(tmp_path, 0.0, name="hfedavg")).summary["privacy"]
    assert summary["releases_by_kind"] == {"aircomp": 8}


def test_without_a_clip_nothing_is_recorded(tmp_path: Path) -> None:
    result = fedge.run(air_run(tmp_path, 10.0, clip=None))
    assert result.summary["privacy"] == {"epsilon": None}
    assert "epsilon" not in result.metrics[-1]


def test_a_clip_needs_aircomp(tmp_path: Path) -> None:
    config = air_run(tmp_path, 10.0)
    config["algorithm"]["aggregation"] = "oma"
    with pytest.raises(ConfigError, match="algorithm.radio.clip"):
        fedge.run(config)


def test_the_effective_std_is_the_signal_models_error() -> None:
    """Eq. 22's signal-level reception: the real part of the estimate's error has std sqrt(MSE / 2), the
    std the real-part noise model accounts; the multiplier scales with n_j / clip."""
    rng = np.random.default_rng(5)
    channels = complex_gaussian(rng, (3, 4))
    beamformer = receive_beamformer(channels, rng)
    snr = 10.0
    values = rng.uniform(-1, 1, (3, 20_000))
    estimate = aircomp_receive(values, channels, beamformer, snr, rng)
    mse = aircomp_mse(snr, float(min_gain(beamformer, channels)), 3)
    error = np.real(estimate) - values.mean(axis=0)
    assert float(error.std()) == pytest.approx(aircomp_noise_std(mse, real_part=True), rel=0.03)
    assert aircomp_noise_multiplier(mse, 2.0, 3) == pytest.approx(math.sqrt(mse) * 3 / 2.0)
    (release,) = aircomp_releases(4, [mse], [[6, 7, 8]], 2.0, real_part=True)
    assert release.clients == (6, 7, 8) and release.clip == pytest.approx(2.0 / 3)
    assert release.noise_multiplier == pytest.approx(math.sqrt(mse / 2) * 3 / 2.0)


def test_each_transmitted_accumulated_gradient_is_clipped(tmp_path: Path) -> None:
    """With a tiny clip the edge models move by at most ``lr * clip`` per edge round (plus the channel
    noise, negligible at 200 dB): the clip bounds what every client transmits."""
    config = RunConfig.model_validate(air_run(tmp_path, 200.0, clip=1e-3, name="hfedavg"))
    built = build_run(config)
    algorithm = built.algorithm
    assert isinstance(algorithm, HierarchicalFL)
    before = {k: v.clone() for k, v in algorithm.params.items()}
    built.context.start("train", 1)
    algorithm.run_round(1)
    moved = torch.sqrt(sum(((algorithm.params[k] - before[k]) ** 2).sum() for k in before))
    lr = config.algorithm.optimizer.lr  # type: ignore[attr-defined]
    assert 0 < float(moved) <= 2 * lr * 1e-3 * (1 + 1e-4)  # two edge rounds, a mean of clipped steps
