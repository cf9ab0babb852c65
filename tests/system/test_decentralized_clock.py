"""The simulated clock of the decentralized family: each client computes, then sends its messages on its
own uplink; clients in parallel. Checked against the formula computed here from the run's ledger.csv,
the client sizes and hand-counted FLOPs; also: every peer algorithm pays for sending, local only
computes, and a resumed run keeps the clock."""

from __future__ import annotations

import csv
from collections import defaultdict

import numpy as np
import pytest
from tiers import parametrize_first_by_default

import fedge
from fedge.config import SystemConfig
from fedge.runner.loop import build_run
from fedge.system import SystemModel
from tests.algorithms.test_decentralized_algorithms import COMMON
from tests.algorithms.test_decentralized_algorithms import config as peer_config

N = 6
BATCH = COMMON["batch_size"]
FORWARD = 2 * (36 * 12 + 12 * 8 + 8 * 4)  # FLOPs of one sample through the 36-12-8-4 MLP (no biases)


def config(tmp_path, algorithm: dict, **top) -> dict:
    """The family's test config (six clients on a small synthetic set, full graph) for two rounds, with
    the clients evenly spaced on 100-300 m."""
    return peer_config(tmp_path, algorithm, **{"rounds": 2, "system": {"distances": "linspace"}, **top})


def ledger_rows(result) -> list[dict[str, str]]:
    with open(result.run_dir / "ledger.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def sent_per_round(rows: list[dict[str, str]]) -> dict[int, np.ndarray]:
    """Bits each client sent, per round."""
    sent: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(N))
    for row in rows:
        sent[int(row["round"])][int(row["src"].split(":")[1])] += int(row["bits"])
    return sent


def chosen_per_round(rows: list[dict[str, str]]) -> dict[int, np.ndarray]:
    """How many requesters each client sent a trained model to, per round."""
    count: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(N))
    for row in rows:
        if row["kind"] == "peer_model":
            count[int(row["round"])][int(row["src"].split(":")[1])] += 1
    return count


def expected_clock(result, flops: dict[int, np.ndarray], sent: dict[int, np.ndarray]) -> tuple[float, float]:
    """Sum over rounds of max_i (compute_i + send_i), and of every client's compute and transmit energy."""
    cfg = SystemConfig(distances="linspace")
    system = SystemModel(cfg, N, result.config.seed)
    power = 10 ** ((cfg.client_power_dbm - 30) / 10)
    seconds = joules = 0.0
    for t in range(1, result.config.rounds + 1):
        compute = flops[t] * cfg.cycles_per_flop / cfg.client_cpu_hz
        send = sent[t] / system.link(t).up_bps
        seconds += float((compute + send).max())
        joules += float((cfg.kappa * cfg.client_cpu_hz**2 * cfg.cycles_per_flop * flops[t]).sum())
        joules += float((power * send).sum())
    return seconds, joules


def client_sizes(cfg: dict) -> np.ndarray:
    data = build_run(fedge.resolve_config(cfg)).context.data
    return np.array([len(ix) for ix in data.client_train], dtype=np.float64)


def test_gossip_clock_is_training_then_sending(tmp_path):
    cfg = config(tmp_path, {"name": "gossip"})
    result = fedge.run(cfg)
    sizes = client_sizes(cfg)
    rows = ledger_rows(result)
    flops = {t: 3 * FORWARD * sizes for t in (1, 2)}
    seconds, joules = expected_clock(result, flops, sent_per_round(rows))
    assert result.summary["sim_seconds"] == pytest.approx(seconds, rel=1e-12)
    assert result.summary["sim_joules"] == pytest.approx(joules, rel=1e-12)


def test_afind_clock_counts_literal_rows_probes_and_losses(tmp_path):
    """Literal AFIND+ on a full graph with Eq. 8: every client computes its own proxy and one proxy per
    neighbour (forward + backward on its probe batch), trains its own row and one row per requester that
    chose it, and evaluates the probe loss of each trained row (forward)."""
    cfg = config(tmp_path, {"name": "afind", "k0": 2})
    result = fedge.run(cfg)
    sizes = client_sizes(cfg)
    probe = np.minimum(sizes, BATCH)
    rows = ledger_rows(result)
    chosen = chosen_per_round(rows)
    flops = {
        t: FORWARD * (3 * sizes * (1 + chosen[t]) + 3 * probe * N + probe * (1 + chosen[t])) for t in (1, 2)
    }
    seconds, joules = expected_clock(result, flops, sent_per_round(rows))
    assert result.summary["sim_seconds"] == pytest.approx(seconds, rel=1e-12)
    assert result.summary["sim_joules"] == pytest.approx(joules, rel=1e-12)


PEERS = {
    "gossip": {"name": "gossip"},
    "pens": {"name": "pens", "selection_rounds": 1, "candidates": 3, "keep": 2},
    "federico": {"name": "federico"},
    "afind": {"name": "afind", "k0": 2},
    "afind-standard": {"name": "afind", "neighbor_mode": "standard"},
    "ditto": {"name": "ditto"},
    "ditto-afind": {"name": "ditto", "peer_selection": "afind"},
    "dispfl": {"name": "dispfl"},
    "dispfl-afind": {"name": "dispfl", "peer_selection": "afind"},
}


@parametrize_first_by_default("variant", list(PEERS))
def test_every_peer_algorithm_pays_for_compute_and_sending(tmp_path, variant):
    """At least: every client's own training, and every peer bit sent at the fastest uplink rate."""
    cfg = config(tmp_path, PEERS[variant], rounds=1)
    result = fedge.run(cfg)
    training = 3 * FORWARD * client_sizes(cfg)
    fastest = SystemModel(SystemConfig(distances="linspace"), N, result.config.seed).link(1).up_bps.max()
    sending = result.summary["bits_peer"] / fastest
    assert sending > 0
    assert result.summary["sim_seconds"] >= training.max() / 1e9
    assert result.summary["sim_joules"] >= 1e-10 * training.sum() + 0.1995 * sending


def test_local_only_computes(tmp_path):
    cfg = config(tmp_path, {"name": "local"})
    result = fedge.run(cfg)
    flops = 3 * FORWARD * client_sizes(cfg)
    assert result.summary["bits_peer"] == 0
    assert result.summary["sim_seconds"] == pytest.approx(2 * flops.max() / 1e9, rel=1e-12)
    assert result.summary["sim_joules"] == pytest.approx(2 * 1e-28 * 1e18 * flops.sum(), rel=1e-12)


class Interrupted(Exception):
    """Stops a run after a round, as a kill would."""


def test_resumed_run_keeps_the_clock(tmp_path):
    cfg = config(tmp_path, {"name": "afind", "k0": 2}, rounds=4)
    cfg["output"].update(checkpoint_every=2, name="interrupted")

    def stop(t: int, row) -> None:
        if t == 3:  # after round 3, whose checkpoint was never written: resume recomputes it
            raise Interrupted

    with pytest.raises(Interrupted):
        fedge.run(cfg, on_round=stop)
    resumed = fedge.resume(tmp_path / "runs" / "interrupted")
    cfg["output"]["name"] = "straight"
    straight = fedge.run(cfg)
    for a, b in zip(resumed.metrics, straight.metrics, strict=True):
        assert (a["sim_seconds"], a["sim_joules"]) == (b["sim_seconds"], b["sim_joules"])
    assert resumed.summary["sim_seconds"] > 0
