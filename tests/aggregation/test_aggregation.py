"""The aggregation pipeline (fedge.aggregation): the built-in means compute what every site computed by
hand before, the config's stages are checked in one line, and a user's own stage (docs/extending.md's
coordinate-wise median) runs at a FedAvg server, HIST's edges and cloud and gossip's peers, on both
executors, on two gloo ranks and in a deployed run, with the same numbers everywhere."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cases import final_state, staged
from tiers import parametrize_first_by_default
from typer.testing import CliRunner

import fedge
from fedge.aggregation import STAGES, AnchoredMean, BlockMean, Part, Reducer, Transform, Updates, WeightedMean
from fedge.aggregation.pipeline import build_pipeline
from fedge.cli.commands import app
from fedge.config import AggregationConfig
from fedge.engine import weighted_sum
from fedge.engine.mixing import mix
from fedge.errors import ConfigError

ROOT = Path(__file__).parents[2]
MEDIAN = ROOT / "examples" / "extending" / "median.py"


def stacked(rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(rows, 5, 3, generator=gen),
        "b": torch.randn(rows, 3, generator=gen),
        "count": torch.randint(0, 9, (rows,), generator=gen),
    }


@pytest.fixture(scope="module")
def median() -> type[Reducer]:
    """docs/extending.md's median stage, registered as ``my_median`` (as running the file would)."""
    if "my_median" not in STAGES:
        spec = importlib.util.spec_from_file_location("median_stage", MEDIAN)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return STAGES["my_median"]


# ----- the built-in means are the arithmetic the sites had -----------------------------------------


def test_the_weighted_mean_is_the_servers_weighted_sum_bit_for_bit():
    rows = stacked(7)
    weights = torch.rand(7, dtype=torch.float64)
    weights /= weights.sum()
    got = WeightedMean().reduce(Updates.of("server", 1, rows, weights))
    want = weighted_sum(rows, weights)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_the_weighted_mean_per_receiver_is_the_peers_mixing_bit_for_bit_in_one_part_or_two():
    rows, decoded = stacked(4), stacked(4, seed=1)
    weights = torch.rand(4, 4, dtype=torch.float64)
    got = WeightedMean().reduce(Updates.of("peer", 1, rows, weights))
    want = mix(rows, weights)
    assert got.keys() == want.keys() == {"w", "b"}  # counters stay with their receivers
    assert all(torch.equal(got[k], want[k]) for k in want)
    own = torch.eye(4, dtype=torch.bool)
    parts = (Part(rows, weights * own), Part(decoded, weights * ~own))
    got = WeightedMean().reduce(Updates("peer", 1, parts))
    mine, theirs = mix(rows, weights * own), mix(decoded, weights * ~own)
    assert all(torch.equal(got[k], mine[k] + theirs[k]) for k in mine)


def test_the_anchored_mean_keeps_agreeing_rows_exactly_and_takes_the_counters_maximum():
    one = {"w": torch.full((3, 4), 0.1), "count": torch.tensor([2, 7, 5])}
    got = AnchoredMean().reduce(Updates.of("cloud", 1, one, torch.full((3,), 1 / 3)))
    assert torch.equal(got["w"], torch.full((4,), 0.1)) and int(got["count"]) == 7


def test_the_block_mean_is_each_edges_client_mean_and_the_processes_shares_add_up_to_it():
    rows = stacked(12)
    weights = torch.zeros(3, 12, dtype=torch.float64)
    for j in range(3):
        weights[j, 4 * j : 4 * (j + 1)] = 1 / 4  # edge server j, clients 4j .. 4j + 3
    got = BlockMean().reduce(Updates.of("edge", 1, rows, weights))
    for k, v in rows.items():
        grouped = v.reshape(3, 4, *v.shape[1:])
        want = grouped.mean(dim=1) if v.is_floating_point() else grouped.max(dim=1).values
        assert torch.equal(got[k], want)
    shares = [  # two processes' rows 0..4 and 5..11: each reduces its own, the sums are added
        BlockMean().reduce(Updates.of("edge", 1, {k: v[rows_] for k, v in rows.items()}, weights[:, rows_]))
        for rows_ in (slice(0, 5), slice(5, 12))
    ]
    torch.testing.assert_close(shares[0]["w"] + shares[1]["w"], got["w"], rtol=0, atol=1e-6)
    assert torch.equal(torch.maximum(shares[0]["count"], shares[1]["count"]), got["count"])


# ----- the config's stages -----------------------------------------------------------------------


class Halve(Transform):
    """Halves every floating row (a transform for the tests)."""

    def apply(self, updates: Updates) -> Updates:
        parts = [
            Part({k: v / 2 if v.is_floating_point() else v for k, v in p.rows.items()}, p.weights)
            for p in updates.parts
        ]
        return updates.with_parts(*parts)


def test_stages_apply_in_order_at_the_sites_they_name_and_the_site_mean_closes_the_chain(median):
    STAGES.setdefault("halve", Halve)
    config = AggregationConfig(
        stages=[{"name": "halve", "at": ["server"]}, {"name": "my_median", "at": ["cloud"]}]
    )
    server, cloud, peer = (build_pipeline(config, site) for site in ("server", "cloud", "peer"))
    assert (server.names, cloud.names, peer.names) == (("halve", "mean"), ("my_median",), ("mean",))
    assert isinstance(peer.reducer, WeightedMean) and not peer.transforms
    assert isinstance(server.transforms[0], Halve) and isinstance(server.reducer, WeightedMean)
    rows = stacked(3)
    weights = torch.full((3,), 1 / 3, dtype=torch.float64)
    halved = server.reduce(Updates.of("server", 1, rows, weights))
    plain = build_pipeline(AggregationConfig(), "server").reduce(Updates.of("server", 1, rows, weights))
    assert torch.allclose(halved["w"], plain["w"] / 2)
    reference = {"count": torch.tensor(-1)}
    got = cloud.reduce(Updates.of("cloud", 1, rows, weights, reference))
    assert torch.equal(got["w"], rows["w"].median(dim=0).values)
    assert int(got["count"]) == -1  # the median left the counter out: the cloud keeps its own


@pytest.mark.parametrize(
    ("stages", "key", "words"),
    [
        (["medain"], "aggregation.stages.0.name", "unknown aggregation stage 'medain'"),
        ([{"name": "mean", "options": {"trim": 0.1}}], "aggregation.stages.0.options", "takes no options"),
        (["my_median", "halve"], "aggregation.stages.1", "a reducer is the last stage"),
    ],
)
def test_a_bad_stage_is_refused_in_one_line_naming_its_key(median, stages, key, words):
    STAGES.setdefault("halve", Halve)
    with pytest.raises(ConfigError) as error:
        fedge.load_config(None, [f"aggregation.stages={json.dumps(stages)}"])
    assert error.value.key == key and words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.ci
def test_the_command_line_refuses_an_unknown_stage_with_exit_code_2(tmp_path):
    result = CliRunner().invoke(app, ["run", "aggregation.stages=[nosuch]", f"output.dir={tmp_path}"])
    assert result.exit_code == 2 and "aggregation.stages.0.name" in result.output
    assert not any(tmp_path.iterdir())  # no run directory was made


# ----- a user's median at a server, a cloud and peers --------------------------------------------


FAMILIES = {
    "fedavg": {"name": "fedavg", "batch_size": 16, "fraction": 0.5},
    "hist": {
        "name": "hist",
        "cells": 3,
        "split": "partition",
        "edge_rounds": 1,
        "local_steps": 2,
        "batch_size": 8,
    },
    "gossip": {"name": "gossip", "batch_size": 16, "peers": 2},
}
SITES = {"fedavg": ["server"], "hist": ["cloud", "edge"], "gossip": ["peer"]}  # HIST: its edges and cloud


@parametrize_first_by_default("family", list(FAMILIES))
def test_the_median_runs_at_its_site_on_both_executors_with_one_result(tmp_path, median, family):
    runs = {
        executor: fedge.run(staged(tmp_path, FAMILIES[family], ["my_median"], executor))
        for executor in ("sequential", "batched")
    }
    mean = fedge.run(staged(tmp_path / "mean", FAMILIES[family], []))
    assert runs["sequential"].summary["aggregation"] == {site: ["my_median"] for site in SITES[family]}
    assert mean.summary["aggregation"] == {site: ["mean"] for site in SITES[family]}
    states = {name: final_state(run.run_dir) for name, run in runs.items()}
    for k, value in states["sequential"].items():
        torch.testing.assert_close(states["batched"][k], value, rtol=0, atol=1e-6)
    averaged = final_state(mean.run_dir)
    assert any(not torch.allclose(averaged[k], states["sequential"][k]) for k in averaged)


WORKER = """
import importlib.util, json, sys, torch
torch.set_num_threads(1)
import fedge
spec = importlib.util.spec_from_file_location("median_stage", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
result = fedge.run(json.loads(sys.argv[2]))
"""


@pytest.mark.ci
def test_the_median_on_two_gloo_ranks_equals_one_process(tmp_path, median):
    cfg = staged(tmp_path, FAMILIES["fedavg"], ["my_median"])
    cfg["algorithm"] = {**cfg["algorithm"], "fraction": 1.0}  # every client: 3 + 3 rows over the ranks
    one = fedge.run(cfg)
    two = {**cfg, "output": {"dir": str(tmp_path / "ranks"), "plots": False}}
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(worker), str(MEDIAN), json.dumps(two)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ranked = next((tmp_path / "ranks").iterdir())
    rows = [json.loads(line) for line in (ranked / "metrics.jsonl").read_text().splitlines()]
    evaluated = {"wall_seconds", "loss"}  # the test loss is summed over the ranks' shares of the test set
    for got, want in zip(rows, one.metrics, strict=True):
        assert {k: v for k, v in got.items() if k not in evaluated} == {
            k: v for k, v in want.items() if k not in evaluated
        }
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)
    mine, theirs = final_state(one.run_dir), final_state(ranked)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_the_median_in_a_deployed_run_equals_the_simulation(tmp_path, median):
    pytest.importorskip("flwr")
    from fedge.api import resolve_config
    from fedge.deploy.loopback import LoopbackTransport
    from fedge.deploy.server_app import run_deployed

    cfg = resolve_config(staged(tmp_path, FAMILIES["fedavg"], ["my_median"]))
    simulated = fedge.run(cfg.model_copy(update={"output": cfg.output.model_copy(update={"name": "sim"})}))
    deployed = run_deployed(cfg, lambda n: LoopbackTransport(cfg, n))
    mine, theirs = final_state(simulated.run_dir), final_state(deployed.run_dir)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert [r["accuracy"] for r in deployed.metrics] == [r["accuracy"] for r in simulated.metrics]
