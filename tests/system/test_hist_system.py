"""HIST's wireless system (Secs. IV-V): mask-size optimiser vs the MILP, OMA and AirComp latency,
the AirComp estimator and the receive beamformer."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.algorithms.hierarchical.config import RadioConfig
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.runtime.hierarchy import Cells
from fedge.system.aircomp import (
    aircomp_cost_per_value,
    aircomp_edge_latency,
    aircomp_mse,
    aircomp_receive,
    aircomp_uplink_seconds,
    min_gain,
    naive_beamformers,
    receive_beamformer,
)
from fedge.system.oma import (
    complex_gaussian,
    db_to_linear,
    oma_cost_per_value,
    oma_edge_latency,
    oma_rates,
)
from fedge.system.partition_opt import greedy_sizes, milp_sizes, round_latency, size_cap, uniform_sizes

D = 238_510  # FCNN values
SHARED, PER_NEURON, NEURONS = 10, 795, 300


def test_greedy_equals_milp_on_random_instances():
    rng = np.random.default_rng(0)
    for _ in range(25):
        cells = int(rng.integers(2, 9))
        units = int(rng.integers(cells, 400))
        costs = rng.uniform(0.1, 3.0, cells)
        shared, per_unit = float(rng.uniform(0, 50)), float(rng.uniform(1, 10))
        cap = size_cap(units, cells)
        greedy = greedy_sizes(costs, units, cap, 1, shared, per_unit)
        exact = milp_sizes(costs, units, cap, 1, shared, per_unit)
        assert greedy.sum() == exact.sum() == units
        assert greedy.max() <= cap and greedy.min() >= 1
        assert round_latency(costs, greedy, shared, per_unit) == pytest.approx(
            round_latency(costs, exact, shared, per_unit), rel=1e-9
        )


def test_equal_costs_give_uniform_sizes_and_caps_hold():
    assert greedy_sizes(np.ones(8), 300, size_cap(300, 8)).tolist() == uniform_sizes(300, 8).tolist()
    assert uniform_sizes(300, 8).tolist() == [38] * 4 + [37] * 4
    assert size_cap(300, 4) == 112  # d_j <= 1.5 d / N (eps_th = 9 delta_1^2)
    assert greedy_sizes(np.array([1.0, 100.0]), 300, size_cap(300, 2)).tolist() == [225, 75]


def _oma_costs(radio: CellRadio, cells: Cells, t: int, steps: int = 20) -> np.ndarray:
    cpu, rates = radio.cpu_hz(t), radio.oma_rates(t)
    return np.array(
        [
            oma_cost_per_value(5, steps, 1e6, D, cpu[cells.members(j)], rates[cells.members(j)])
            for j in range(cells.num_cells)
        ]
    )


@pytest.mark.parametrize("num_cells", [2, 4, 6, 8])
def test_optimised_sizes_cut_oma_latency_and_favour_strong_cells(num_cells):
    """Sec. VI-C's (30/40 dB, 1-2/2-4 GHz halves, M = 10, 9 MHz, H = 20, E = 5): 10-15 % below uniform."""
    cells = Cells.even(60, num_cells)
    radio = CellRadio(RadioConfig(), cells, seed=0)
    uniform, optimised, sizes = [], [], []
    for t in range(1, 31):
        costs = _oma_costs(radio, cells, t)
        best = greedy_sizes(costs, NEURONS, size_cap(NEURONS, num_cells), 1, SHARED, PER_NEURON)
        uniform.append(round_latency(costs, uniform_sizes(NEURONS, num_cells), SHARED, PER_NEURON))
        optimised.append(round_latency(costs, best, SHARED, PER_NEURON))
        sizes.append(best)
    saving = 1 - np.mean(optimised) / np.mean(uniform)
    assert 0.08 < saving < 0.2
    half = num_cells // 2
    mean_sizes = np.mean(sizes, axis=0)
    assert mean_sizes[half:].min() > mean_sizes[:half].max()
    assert np.mean(uniform) == pytest.approx({2: 5.27, 4: 1.32, 6: 0.59, 8: 0.31}[num_cells], rel=0.1)


def test_oma_latency_grows_with_cell_size_and_aircomp_uplink_does_not():
    rng = np.random.default_rng(1)
    cpu = rng.uniform(2e9, 4e9, 30)
    rates = oma_rates(9e6, db_to_linear(30.0), complex_gaussian(rng, (30, 10)))
    bits = 32 * D / 4
    oma = [
        oma_edge_latency(40, 0.25, 1e6, cpu[:n], bits, rates[:n]) - 40 * 0.25 * 1e6 / cpu[:n].min()
        for n in (10, 20, 30)
    ]
    assert oma[1] > 1.8 * oma[0] and oma[2] > 2.7 * oma[0]  # TDMA: n_j uploads one after another
    assert aircomp_uplink_seconds(D, 9e6, 15e3, 1 / 14e3) == pytest.approx(D / 600 / 14e3)
    air = [aircomp_edge_latency(40, 0.25, 1e6, cpu[:n], D / 4, 9e6, 15e3, 1 / 14e3) for n in (10, 20, 30)]
    assert air[0] - 40 * 0.25 * 1e6 / cpu[:10].min() == pytest.approx(
        air[2] - 40 * 0.25 * 1e6 / cpu[:30].min()
    )


def test_per_edge_round_latency_ordering_at_n4_h40():
    """AirComp-HIST (~12 ms) < AirComp-HFedAvg (~48 ms) < OMA-HIST (~0.25 s) < OMA-HFedAvg (~1 s)."""
    rng = np.random.default_rng(2)
    out = {"air_hist": [], "air_hfedavg": [], "oma_hist": [], "oma_hfedavg": []}
    for _ in range(20):
        cpu = rng.uniform(2e9, 4e9, 15)
        rates = oma_rates(9e6, db_to_linear(30.0), complex_gaussian(rng, (15, 10)))
        for name, share in (("hist", 0.25), ("hfedavg", 1.0)):
            out[f"oma_{name}"].append(oma_edge_latency(40, share, 1e6, cpu, 32 * D * share, rates))
            out[f"air_{name}"].append(
                aircomp_edge_latency(40, share, 1e6, cpu, D * share, 9e6, 15e3, 1 / 14e3)
            )
    means = {k: np.mean(v) for k, v in out.items()}
    assert means["air_hist"] < means["air_hfedavg"] < means["oma_hist"] < means["oma_hfedavg"]
    assert means["air_hist"] == pytest.approx(0.012, rel=0.15)
    assert means["air_hfedavg"] == pytest.approx(0.048, rel=0.15)
    assert means["oma_hist"] == pytest.approx(0.25, rel=0.15)
    assert means["oma_hfedavg"] == pytest.approx(1.0, rel=0.15)


def test_global_round_latency_falls_from_two_to_six_cells():
    per_n = []
    for num_cells in (2, 4, 6):
        cells = Cells.even(60, num_cells)
        radio = CellRadio(RadioConfig(), cells, seed=3)
        sizes = uniform_sizes(NEURONS, num_cells)
        per_n.append(
            np.mean(
                [round_latency(_oma_costs(radio, cells, t), sizes, SHARED, PER_NEURON) for t in range(1, 11)]
            )
        )
    assert per_n[0] > per_n[1] > per_n[2]


def test_aircomp_costs_prefer_fast_cpus():
    slow = aircomp_cost_per_value(5, 40, 1e6, D, np.array([1e9, 2e9]), 9e6, 15e3, 1 / 14e3)
    fast = aircomp_cost_per_value(5, 40, 1e6, D, np.array([2e9, 4e9]), 9e6, 15e3, 1 / 14e3)
    assert slow > fast
    assert fast * D / 5 == pytest.approx(40 * 1e6 / 2e9 + D / 600 / 14e3)


@pytest.mark.parametrize("normalisation", ["paper", "tight"])
def test_aircomp_estimate_is_unbiased_with_the_eq25_variance(normalisation):
    rng = np.random.default_rng(4)
    channels = complex_gaussian(rng, (15, 10))
    beam = receive_beamformer(channels, rng)
    values = rng.normal(size=(15, 20_000))
    snr = db_to_linear(-10.0)
    estimate = aircomp_receive(values, channels, beam, snr, rng, normalisation)
    error = estimate - values.mean(axis=0)
    mse = aircomp_mse(snr, float(min_gain(beam, channels)), 15, normalisation)
    assert abs(error.mean()) < 4 * np.sqrt(mse / 20_000)  # unbiased
    assert np.mean(np.abs(error) ** 2) == pytest.approx(mse, rel=0.03)  # Eq. 25
    assert np.var(error.real) == pytest.approx(mse / 2, rel=0.04)  # the real part carries half
    nu = np.sqrt(snr * min_gain(beam, channels)) * (15 if normalisation == "tight" else 1)
    alpha = 1.0 / (15 * np.conj(beam / nu) @ channels.T)
    assert np.max(np.abs(alpha) ** 2) <= snr * (1 if normalisation == "tight" else 1 / 15**2) * (1 + 1e-9)


def test_beamformer_beats_naive_candidates_and_random_search():
    rng = np.random.default_rng(5)
    gains = []
    for _ in range(5):
        channels = complex_gaussian(rng, (15, 10))
        best = float(min_gain(receive_beamformer(channels, rng), channels))
        search = complex_gaussian(rng, (20_000, 10))
        search /= np.linalg.norm(search, axis=1, keepdims=True)
        assert best >= min_gain(naive_beamformers(channels), channels).max()
        assert best >= min_gain(search, channels).max()
        gains.append(best)
    assert 1.2 < np.mean(gains) < 2.0  # about 1.5-1.6 at n_j = 15, M = 10 in our own trials


def _mean_mse(clients: int, antennas: int, snr_db: float, draws: int = 6) -> float:
    rng = np.random.default_rng(6)
    out = []
    for _ in range(draws):
        channels = complex_gaussian(rng, (clients, antennas))
        gain = float(min_gain(receive_beamformer(channels, rng, restarts=0, outer=10, inner=40), channels))
        out.append(aircomp_mse(db_to_linear(snr_db), gain, clients))
    return float(np.mean(out))


def test_aircomp_mse_falls_with_snr_and_antennas_and_grows_with_clients():
    assert _mean_mse(15, 10, 0.0) == pytest.approx(10 * _mean_mse(15, 10, 10.0))
    assert _mean_mse(15, 6, 0.0) > _mean_mse(15, 10, 0.0) > _mean_mse(15, 16, 0.0)
    assert _mean_mse(30, 10, 0.0) > _mean_mse(15, 10, 0.0) > _mean_mse(5, 10, 0.0)
    assert aircomp_mse(2.0, 0.5, 15, "paper") == 1.0  # tight power use: smaller by n_j^2
    assert aircomp_mse(2.0, 0.5, 15, "paper") == pytest.approx(15**2 * aircomp_mse(2.0, 0.5, 15, "tight"))
