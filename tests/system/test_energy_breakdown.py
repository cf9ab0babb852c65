"""The simulated clock's breakdown: seconds by phase along the critical path, joules by phase, node tier
and node. It adds up to the totals, each family's phases come out where its composition puts them, it
survives a resume, and the summary table, summary.json and energy.csv show it."""

from __future__ import annotations

import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
from cases import killed_after, tiny
from tiers import parametrize_first_by_default
from typer.testing import CliRunner

import fedge
from fedge.cli.commands import app
from fedge.comm import nodes
from fedge.config import SystemConfig
from fedge.report.page import energy_models, render
from fedge.system import Clock, RoundCost
from fedge.system.clock import client_nodes
from fedge.system.model import SystemModel, energy_assumption

BREAKDOWN = ("sim_seconds_by_phase", "sim_joules_by_phase", "sim_joules_by_tier")


def run(name: str, tmp_path, rounds: int = 2, knobs: dict | None = None, **keys) -> fedge.Result:
    config = tiny(name, tmp_path / "runs", rounds=rounds)
    config["algorithm"].update(knobs or {})
    config.update(keys)
    return fedge.run(config)


def assert_adds_up(record: dict) -> None:
    """Every breakdown in a row or summary adds up to its total."""
    assert sum(record["sim_seconds_by_phase"].values()) == pytest.approx(record["sim_seconds"], rel=1e-9)
    assert sum(record["sim_joules_by_phase"].values()) == pytest.approx(record["sim_joules"], rel=1e-9)
    assert sum(record["sim_joules_by_tier"].values()) == pytest.approx(record["sim_joules"], rel=1e-9)


@parametrize_first_by_default(
    ("algorithm", "seconds", "tiers"),
    [
        ("fedavg", {"downlink", "client_compute", "uplink"}, {"client", "server"}),
        ("splitfed_v1", {"downlink", "client_compute", "uplink", "server_compute"}, {"client", "server"}),
        ("afind", {"client_compute", "peer"}, {"client"}),
        ("hist", {"client_compute", "uplink"}, {"client"}),
        ("centralized", {"server_compute"}, {"server"}),
    ],
)
def test_each_family_charges_its_phases_and_the_breakdown_adds_up(tmp_path, algorithm, seconds, tiers):
    result = run(algorithm, tmp_path)
    for row in result.metrics:
        assert_adds_up(row)
    summary = result.summary
    assert_adds_up(summary)
    assert set(summary["sim_seconds_by_phase"]) == seconds
    assert set(summary["sim_joules_by_tier"]) == tiers
    assert sum(summary["sim_joules_top_nodes"].values()) <= summary["sim_joules"] * (1 + 1e-9)
    with (result.run_dir / "energy.csv").open() as handle:
        per_node = {entry["node"]: entry for entry in csv.DictReader(handle)}
    assert math.fsum(float(e["joules"]) for e in per_node.values()) == pytest.approx(summary["sim_joules"])
    for entry in per_node.values():  # each node's phases add up to its joules
        phases = [float(v) for k, v in entry.items() if k not in ("node", "tier", "joules")]
        assert math.fsum(phases) == pytest.approx(float(entry["joules"]))


def test_fedavg_downlink_energy_is_the_servers_and_clients_pay_compute_and_uplink(tmp_path):
    summary = run("fedavg", tmp_path).summary
    top = summary["sim_joules_top_nodes"]
    by_phase = summary["sim_joules_by_phase"]
    assert top["server"] == pytest.approx(by_phase["downlink"])
    clients = sum(v for node, v in top.items() if node != "server")
    assert clients == pytest.approx(by_phase["client_compute"] + by_phase["uplink"])


def test_a_shared_server_bound_round_is_the_servers_compute(tmp_path):
    """CSE-FSL's one server model serves every upload in turn: with a slow server the round lasts its
    compute (the critical path); with a fast one the slowest client's path."""
    slow = run("cse_fsl", tmp_path / "slow", system={"server_cpu_hz": 1e3}).summary
    assert set(slow["sim_seconds_by_phase"]) == {"server_compute"}
    assert slow["sim_seconds_by_phase"]["server_compute"] == pytest.approx(slow["sim_seconds"])
    fast = run("cse_fsl", tmp_path / "fast").summary
    assert "server_compute" not in fast["sim_seconds_by_phase"]
    assert_adds_up(fast)


def test_arrival_order_puts_the_queue_on_the_critical_path_as_wait(tmp_path):
    keys = {"server_order": "arrival", "arrival_jitter_s": 0.05}
    summary = run("cse_fsl", tmp_path, knobs=keys).summary
    assert_adds_up(summary)
    assert summary["sim_seconds_by_phase"]["wait"] > 0


def test_light_fedsl_aggregation_phase_is_t_agg(tmp_path):
    result = run("light_fedsl", tmp_path, rounds=4, knobs={"agg_interval": 2})
    last = result.metrics[-1]
    assert last["sim_seconds_by_phase"]["aggregation"] == pytest.approx(last["agg_seconds_total"])
    assert sum(r["latency_round_s"] for r in result.metrics) == pytest.approx(last["sim_seconds"])
    assert_adds_up(last)


def test_hist_latency_is_the_clock_and_its_breakdown(tmp_path):
    result = run("hist", tmp_path, rounds=3)
    assert sum(r["latency_s"] for r in result.metrics) == pytest.approx(result.summary["sim_seconds"])
    assert_adds_up(result.summary)


def test_resume_keeps_the_breakdown(tmp_path):
    config = tiny("cse_fsl", tmp_path / "runs", rounds=4)
    config["output"].update(name="cut", checkpoint_every=2)

    killed_after(config, 3)
    resumed = fedge.resume(tmp_path / "runs" / "cut")
    config["output"]["name"] = "whole"
    whole = fedge.run(config)
    for key in (*BREAKDOWN, "sim_joules_top_nodes", "sim_seconds", "sim_joules"):
        assert resumed.summary[key] == whole.summary[key]
    assert (resumed.run_dir / "energy.csv").read_text() == (whole.run_dir / "energy.csv").read_text()


def test_a_clock_from_before_the_breakdown_loads_its_totals():
    clock = Clock()
    clock.load_state_dict({"seconds": 2.0, "joules": 3.0})
    assert (clock.seconds, clock.joules, clock.breakdown()["sim_joules_by_phase"]) == (2.0, 3.0, {})
    clock.charge(RoundCost(1.0, 1.0, {"uplink": 1.0}, {"client:0": {"uplink": 1.0}}))
    restored = Clock()
    restored.load_state_dict(clock.state_dict())
    assert restored == clock


def test_node_names_are_the_ledgers():
    assert client_nodes(np.array([0, 7])) == nodes.clients([0, 7])


def test_the_summary_table_shows_the_breakdown(tmp_path):
    outcome = CliRunner().invoke(app, ["run", f"output.dir={tmp_path}", "rounds=1"])
    assert outcome.exit_code == 0, outcome.output
    assert "time on the critical path" in outcome.output
    assert "energy by phase" in outcome.output
    assert "client_compute" in outcome.output


def test_default_energy_per_flop_follows_the_hardware_classes():
    """A data-centre server does more FLOPs per joule than a phone-class client (it used to be charged
    ten times a client's joules per FLOP), each within its hardware class: a mobile SoC a few to about
    ten GFLOP/J, a GPU server tens of GFLOP/J or more."""
    system = SystemModel(SystemConfig(), num_clients=2, seed=0)
    flops = np.array([1e9])
    client = flops[0] / system.client_compute(flops, np.array([0])).joules[0]
    server = flops[0] / system.server_compute(flops).joules[0]
    assert server > client
    assert 1e9 <= client <= 2e10
    assert 1e10 <= server <= 1e12


@pytest.mark.ci
def test_the_energy_model_is_printed_beside_the_joules(tmp_path):
    outcome = CliRunner().invoke(
        app, ["run", f"output.dir={tmp_path}", "rounds=1", "system.server_compute_w=4"]
    )
    assert outcome.exit_code == 0, outcome.output
    line = next(row for row in outcome.output.splitlines() if "energy model" in row)
    assert "server 25 GFLOP/J" in line and "client 10 GFLOP/J" in line
    page = render(tmp_path)
    assert "server 25 GFLOP/J" in page


def test_the_energy_model_states_each_cells_own_where_they_differ():
    cheap = SystemConfig(server_compute_w=1.0)
    assert "100 GFLOP/J" in energy_assumption(cheap)
    assert "free" in energy_assumption(SystemConfig(kappa=0.0))
    assert energy_assumption(cheap) != energy_assumption(SystemConfig())

    def cell(label: str, system: dict) -> SimpleNamespace:
        return SimpleNamespace(label=label, runs=[SimpleNamespace(config={"system": system})])

    same = energy_models([cell("a", {}), cell("b", {"distances": "linspace"})])
    assert same == energy_assumption(SystemConfig())  # one model: stated once
    mixed = energy_models([cell("a", {}), cell("b", {"server_compute_w": 1.0}), cell("old", {"gone": 1})])
    assert "a: client 10" in mixed and "b: client 10" in mixed and "100 GFLOP/J" in mixed
    assert "old: the system block of config.yaml" in mixed  # a key this fedge no longer reads
