"""Wireless system model: hand-computed rate oracles, latency and energy of known payloads, the clock."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

import fedge
from fedge.config import SystemConfig
from fedge.errors import ConfigError
from fedge.runner.loop import build_run
from fedge.system import (
    SystemModel,
    compute_energy,
    compute_seconds,
    dbm_to_watt,
    forward_flops,
    parallel_clients,
    path_loss_db,
)
from fedge.system.model import PhaseCost


def linspace_system(n: int = 3) -> SystemModel:
    return SystemModel(SystemConfig(distances="linspace"), n, seed=0)


def test_path_loss_uses_kilometres():
    assert path_loss_db(1000.0) == pytest.approx(128.1)
    assert path_loss_db(np.array([100.0, 200.0, 300.0])) == pytest.approx([90.50, 101.82, 108.44], abs=0.01)


def test_rates_match_light_fedsl_oracles():
    link = linspace_system().link(1)  # clients at 100, 200, 300 m
    assert link.up_bps / 1e6 == pytest.approx([65.63, 46.84, 35.88], abs=0.1)
    assert link.down_bps / 1e6 == pytest.approx([88.88, 70.08, 59.08], abs=0.1)


def test_latency_and_energy_of_a_known_payload():
    system = linspace_system()
    bits = np.full(3, 8e6)  # 1 MB each
    up = system.upload(np.arange(3), bits, 1)
    assert up.seconds == pytest.approx(8e6 / (np.array([65.63, 46.84, 35.88]) * 1e6), rel=2e-3)
    assert up.joules == pytest.approx(dbm_to_watt(23.0) * up.seconds)
    assert dbm_to_watt(23.0) == pytest.approx(0.1995, abs=1e-4)
    down = system.download(np.array([2]), np.array([8e6]), 1)
    assert down.seconds[0] == pytest.approx(8e6 / 59.08e6, rel=2e-3)
    assert compute_seconds(2e9, 1.0, 1e9) == pytest.approx(2.0)
    assert compute_energy(2e9, 1.0, 1e9, 1e-28) == pytest.approx(1e-28 * 1e18 * 2e9)


def test_a_peer_send_costs_an_upload_of_the_same_bits_on_the_senders_uplink():
    system = linspace_system()
    bits = np.array([8e6, 0.0, 4e6])
    peer = system.peer_send(np.arange(3), bits, 1)
    assert peer.seconds == pytest.approx(bits / (np.array([65.63, 46.84, 35.88]) * 1e6), rel=2e-3)
    assert peer.joules == pytest.approx(dbm_to_watt(23.0) * peer.seconds)
    assert peer.seconds[1] == 0.0


def test_parallel_clients_takes_the_slowest_sum_and_all_energy():
    a = PhaseCost(np.array([1.0, 2.0]), np.array([0.5, 0.5]), "downlink", ["server", "server"])
    b = PhaseCost(np.array([3.0, 1.0]), np.array([1.0, 2.0]), "uplink", ["client:0", "client:1"])
    cost = parallel_clients(a, b)
    assert (cost.seconds, cost.joules) == (4.0, 4.0)
    assert cost.seconds_by_phase == {"downlink": 1.0, "uplink": 3.0}  # the slowest client's path
    assert cost.joules_by_node == {
        "server": {"downlink": 1.0},
        "client:0": {"uplink": 1.0},
        "client:1": {"uplink": 2.0},
    }


def test_fading_changes_rates_per_round_deterministically():
    cfg = SystemConfig(fading="rayleigh")
    one, two = SystemModel(cfg, 4, seed=1), SystemModel(cfg, 4, seed=1)
    assert np.array_equal(one.link(3).up_bps, two.link(3).up_bps)
    assert not np.array_equal(one.link(3).up_bps, one.link(4).up_bps)


def test_forward_flops_of_a_linear_layer():
    assert forward_flops(nn.Sequential(nn.Flatten(), nn.Linear(12, 5)), (3, 4)) == 2 * 12 * 5


def test_bad_distance_range_names_the_key():
    with pytest.raises(ConfigError) as info:
        fedge.resolve_config({"system": {"distance_min_m": 300, "distance_max_m": 100}})
    assert info.value.key == "system.distance_max_m"


def test_fedavg_clock_follows_the_composition(tiny_config):
    """One round, full participation: latency = max over clients of download + compute + upload."""
    tiny_config.update(rounds=1)
    tiny_config["system"] = {"distances": "linspace"}
    result = fedge.run(tiny_config)
    system = SystemModel(result.config.system, 5, result.config.seed)
    model_bits = (36 * 16 + 16 + 16 * 4 + 4) * 32
    sizes = np.array([len(ix) for ix in _client_train(result.config)])
    flops = 3 * 2 * (36 * 16 + 16 * 4) * sizes
    link = system.link(1)
    per_client = model_bits / link.down_bps + flops / 1e9 + model_bits / link.up_bps
    assert result.summary["sim_seconds"] == pytest.approx(per_client.max(), rel=1e-6)
    assert result.summary["sim_joules"] > 0


def _client_train(config):
    return build_run(config).context.data.client_train
