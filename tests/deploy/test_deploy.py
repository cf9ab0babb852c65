"""fedge on Flower's Deployment Runtime: a SuperLink and three SuperNodes as separate processes over
gRPC on loopback. Every deployable algorithm's run must end with the simulated run's model and ledger;
a SuperNode killed mid-run drops out of its rounds while the run completes; under TLS with node
authentication an unknown key cannot join; refused algorithms fail in one line. The runtime tests carry
the ``deploy`` marker (CI's second step); the payload checks and the in-process loopback runs (the same
records, node code and checks without the runtime's processes) run wherever Flower is installed.

CI runs on the runtime what only the runtime exercises: each of the ClientApp's message handlers (one
algorithm per handler family, :data:`ON_THE_RUNTIME`), one dropout, TLS with node authentication and the
launcher's port retry. The other runtime runs go through the same handlers and the same transport, and
their server side is checked in process (here and in tests/deploy/test_split_deployed.py); they carry the
``slow`` marker too and run on demand (docs/deploy.md)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord  # noqa: E402

from fedge import run  # noqa: E402
from fedge.api import resolve_config  # noqa: E402
from fedge.deploy.launch import Federation, Tls  # noqa: E402
from fedge.deploy.loopback import LoopbackTransport  # noqa: E402
from fedge.deploy.rounds import REFUSED, deployed_class  # noqa: E402
from fedge.deploy.server_app import run_deployed  # noqa: E402
from fedge.deploy.wire import Rejected, check, expect, from_record, to_record  # noqa: E402
from fedge.engine import ClientBank  # noqa: E402
from fedge.errors import ConfigError, FedgeError  # noqa: E402
from fedge.runner import checkpoint  # noqa: E402
from fedge.runner.loop import build_run  # noqa: E402
from fedge.tensors import Tensors  # noqa: E402

NODES = 3
# A killed node costs its rounds this long; raise it on a heavily loaded machine (normal replies slower:
# a few seconds each with the long-lived ClientApp processes). Round 3 finds the killed node unavailable
# at once once the SuperLink has missed its heartbeats (about a minute), otherwise it waits it out too.
KILL_TIMEOUT = float(os.environ.get("FEDGE_DEPLOY_ROUND_TIMEOUT", "30"))
ALGORITHMS = {
    "fedavg": {"name": "fedavg", "batch_size": 64},
    "cse_fsl": {"name": "cse_fsl", "h": 2, "local_steps": 4, "batch_size": 32},
    "fsl_sage": {
        "name": "fsl_sage", "h": 2, "local_steps": 4, "batch_size": 32, "align_every": 1, "align_epochs": 2,
    },
    "splitfed_v2": {"name": "splitfed_v2", "local_steps": 1, "batch_size": 32},
    "fsl_an": {"name": "fsl_an", "local_steps": 2, "batch_size": 32},
    "splitfed_v1": {"name": "splitfed_v1", "local_steps": 1, "batch_size": 32},
    "light_fedsl": {"name": "light_fedsl", "batch_size": 32, "agg_interval": 2, "final_sparsity": 0.5},
    "fedsl": {"name": "fedsl", "batch_size": 32},
    "hfedavg": {"name": "hfedavg", "cells": 2, "edge_rounds": 2, "local_steps": 2, "split": "partition"},
    "hist": {
        "name": "hist", "cells": 2, "edge_rounds": 2, "local_steps": 2, "split": "partition",
        "aggregation": "aircomp",
    },
    **{
        name: {"name": name, "local_epochs": 1, "batch_size": 64, "peers": 2, "ft_epochs": 0}
        for name in ("afind", "local", "gossip", "pens", "federico", "dispfl", "fedfomo")
    },
    "fedavg_ft": {"name": "fedavg_ft", "batch_size": 64},
    "ditto": {
        "name": "ditto", "local_epochs": 2, "local_update": "alternating", "batch_size": 64, "peers": 2,
        "ft_epochs": 0,
    },
}  # fmt: skip
ROUNDS = {"hfedavg": 1, "hist": 1, "ditto": 1}  # two edge rounds; Ditto's three training phases a round
ON_THE_RUNTIME = {
    "fedavg": "train.rows: the remote executor of every non-split algorithm",
    "fsl_sage": "train and train.aux: the aux-head split round (CSE-FSL, FSL_AN), the aux model kept",
    "splitfed_v2": "query.smashed and train.apply_gradients: the row kept between them (SplitFed v1)",
    "light_fedsl": "query.forward and train.backward: lightweight and traditional FedSL",
}
"""The runtime runs CI keeps: one per family of ClientApp handlers, and what it stands for. The others'
server side is checked in process: FedAvg, HIST, Gossip and Ditto over the loopback transport (this
file), every split algorithm's deployed round against its simulation (tests/deploy/test_split_deployed.py)."""
HIERARCHICAL = ("hfedavg", "hist")
SPLIT = ("cse_fsl", "splitfed_v2", "fsl_an", "splitfed_v1", "light_fedsl", "fedsl", "fsl_sage")


def config(tmp: Path, algorithm: str, rounds: int = 2, clients: int = NODES, **extra):
    split = algorithm in SPLIT
    return resolve_config(
        {
            "seed": 3,
            "rounds": rounds,
            "data": {"name": "digits"},
            "partition": {"kind": "iid", "num_clients": clients},
            "model": {"name": "mlp", "options": {"hidden": [32]}, "cut": 1 if split else None},
            "algorithm": ALGORITHMS[algorithm],
            "engine": {"executor": "sequential", "threads": 1},
            "output": {"dir": str(tmp / "runs"), "plots": False},
            **extra,
        }
    )


def tensors_of(state, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a checkpointed state, by path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        out = {}
        for key, value in state.items():
            out.update(tensors_of(value, f"{prefix}.{key}"))
        return out
    return {}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    with Federation(tmp_path_factory.mktemp("flwr-home")).start() as fed:
        for client in range(NODES):
            fed.add_node(client, NODES)
        yield fed


# ----- payloads --------------------------------------------------------------------------------------


def test_records_round_trip_and_malformed_replies_are_rejected_with_the_reason():
    model: Tensors = {"w": torch.randn(4, 3), "b": torch.randn(3), "n": torch.tensor(5)}
    back = from_record(to_record(model))
    assert all(torch.equal(back[k], model[k]) for k in model)
    specs = expect(model, np.dtype(np.float32))
    check(to_record(model), specs)
    half = to_record(model, np.dtype(np.float16))
    assert half["w"].dtype == "float16" and half["n"].dtype == "int64"
    bad = {
        "keys differ": ArrayRecord({"w": Array(np.zeros((4, 3), np.float32))}),
        "dtype": ArrayRecord({**to_record(model), "w": Array(np.zeros((4, 3), np.float64))}),
        "shape": ArrayRecord({**to_record(model), "b": Array(np.zeros(4, np.float32))}),
        "not finite": ArrayRecord({**to_record(model), "b": Array(np.full(3, np.nan, np.float32))}),
    }
    for reason, record in bad.items():
        with pytest.raises(Rejected, match=reason):
            check(record, specs)


# ----- the runtime -----------------------------------------------------------------------------------


def simulate(cfg, tmp_path: Path):
    """The simulated run of ``cfg`` (in its own output folder)."""
    return run(
        cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": str(tmp_path / "sim")})})
    )


def assert_equal_runs(deployed: Path, simulated, algorithm: str, trained: range | None = None) -> None:
    """The deployed run has the simulation's model, ledger and files; the runtime's record is whole (a
    node of each client in ``trained``: by default every client, a hierarchy's first two)."""
    got = tensors_of(checkpoint.load(deployed / "checkpoint.pt").state["algorithm"])
    want = tensors_of(checkpoint.load(simulated.run_dir / "checkpoint.pt").state["algorithm"])
    assert got.keys() == want.keys()
    assert max(float((got[k].double() - want[k].double()).abs().max()) for k in want) <= 1e-5
    assert (deployed / "ledger.csv").read_text() == (simulated.run_dir / "ledger.csv").read_text()
    assert {p.name for p in simulated.run_dir.iterdir()} <= {p.name for p in deployed.iterdir()}
    summary = json.loads((deployed / "deploy.json").read_text())
    s = simulated.summary
    assert summary["ledger_bits"] == {"up": s["bits_up"], "down": s["bits_down"], "peer": s["bits_peer"]}
    if s["bits_peer"]:  # the relay's cost: every peer message up to the SuperLink and down again
        assert summary["relay"]["relayed_bits"] == 2 * s["bits_peer"]
    else:
        assert "relay" not in summary
    if algorithm == "fedavg":  # fp32 rows carry the model plus their batch plan: a few percent more
        assert 1.0 < summary["carried_bits"]["up"] / s["bits_up"] < 1.15
    timings = [json.loads(line) for line in (deployed / "nodes.jsonl").read_text().splitlines()]
    if trained is None:
        trained = range(2) if algorithm in HIERARCHICAL else range(NODES)  # 2 cells of 1: client 2 idles
    assert {t["node"] for t in timings} == {f"client:{c}" for c in trained}
    assert all(t["seconds"] >= t["compute_seconds"] > 0 for t in timings)


# ----- in process: the deployed rounds over the loopback transport ------------------------------------


@pytest.mark.parametrize("algorithm", ["fedavg", "hist", "gossip", "ditto"])
def test_a_loopback_deployment_equals_the_simulation(tmp_path, algorithm):
    cfg = config(tmp_path, algorithm, rounds=ROUNDS.get(algorithm, 2))
    deployed = run_deployed(cfg, lambda n: LoopbackTransport(cfg, n))
    assert_equal_runs(deployed.run_dir, simulate(cfg, tmp_path), algorithm)


ADVERSARIES = {
    "label_flip_median": ({"clients": [1], "attack": "label_flip"}, ["median"]),
    "sign_flip": ({"clients": [0], "attack": "sign_flip", "options": {"scale": 2.0}}, []),
    "alie_trimmed": ({"clients": [2], "attack": "alie"}, [{"name": "trimmed_mean", "options": {"trim": 1}}]),
    "backdoor_median": ({"clients": [1], "attack": "backdoor", "options": {"scale": 2.0}}, ["median"]),
}
"""Deployed FedAvg adversaries: data poisoning on the malicious node (flipped labels, a backdoor's stamped
samples, from its own build of the config), model poisoning where the simulation applies it (the server's
rows at receipt), rank-local and omniscient, before the mean or a robust reducer."""


def adversarial(tmp: Path, case: str):
    """FedAvg's deployment config under the adversary ``case``."""
    adversary, stages = ADVERSARIES[case]
    return config(tmp, "fedavg", adversary=adversary, aggregation={"stages": stages})


@pytest.mark.parametrize("case", list(ADVERSARIES))
def test_a_loopback_deployment_with_an_adversary_equals_the_simulation(tmp_path, case):
    cfg = adversarial(tmp_path, case)
    deployed = run_deployed(cfg, lambda n: LoopbackTransport(cfg, n))
    simulated = simulate(cfg, tmp_path)
    assert_equal_runs(deployed.run_dir, simulated, "fedavg")
    assert [r["malicious"] for r in deployed.metrics] == [1, 1]
    for key in ("malicious_kept", "attack_success", "accuracy"):
        got = [r.get(key) for r in deployed.metrics]
        assert got == pytest.approx([r.get(key) for r in simulated.metrics], abs=1e-6), key


@pytest.mark.parametrize("algorithm", ["fedavg", "gossip"])
def test_a_client_lost_from_round_two_keeps_its_rows_and_is_named_in_the_metrics(tmp_path, algorithm):
    """The rule: a client that does not train keeps the rows it was sent (it did not move), its loss is
    the mean of the others'; the metrics row names it."""
    cfg = config(tmp_path, algorithm, rounds=2)
    lost = run_deployed(cfg, lambda n: LoopbackTransport(cfg, n, silent=frozenset({2}), silent_from=2))
    rows = lost.metrics
    assert [r["dropped_nodes"] for r in rows] == [[], ["client:2"]] and rows[1]["dropped"] == 1
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["accuracy"]) for r in rows)
    whole = run_deployed(
        cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": str(tmp_path / "whole")})}),
        lambda n: LoopbackTransport(cfg, n),
    )
    state = checkpoint.load(lost.run_dir / "checkpoint.pt").state["algorithm"]
    other = checkpoint.load(whole.run_dir / "checkpoint.pt").state["algorithm"]
    if algorithm == "gossip":  # client 2 kept round 1's mixed row; the others mixed it in unchanged
        ours, theirs = state["bank"]["params"], other["bank"]["params"]
        assert all(not torch.equal(ours[k], theirs[k]) for k in ours)
    else:
        assert all(not torch.equal(state["params"][k], other["params"][k]) for k in state["params"])
    dropped = json.loads((lost.run_dir / "deploy.json").read_text())["dropped"]
    assert list(dropped) == ["2"] and "no reply" in dropped["2"]["2"]


def test_the_remote_executor_refuses_what_would_not_run_on_the_nodes(tmp_path):
    """A step function the algorithm does not hold cannot be named to a node; per-batch ``map`` work
    would run in the server app: both fail naming why."""
    cfg = config(tmp_path, "fedavg")
    built = build_run(cfg)
    algorithm = deployed_class("fedavg")(built.context, cfg.algorithm)
    algorithm.attach(LoopbackTransport(cfg, NODES))
    executor = algorithm.ctx.executor
    bank = ClientBank.broadcast([0], algorithm.params, algorithm.buffers)
    with pytest.raises(FedgeError, match="does not hold"):
        executor.train(lambda *a: a, bank, None, built.context.data, 0.1)
    with pytest.raises(FedgeError, match="per-batch client work"):
        executor.map(None, state=(), batch=(), shared=(), counts=torch.ones(1))


@pytest.mark.parametrize("algorithm", sorted(REFUSED))
def test_refused_algorithms_fail_in_one_line_naming_why(algorithm):
    with pytest.raises(ConfigError, match=r"algorithm\.name.*cannot be deployed: ") as caught:
        deployed_class(algorithm)
    assert "\n" not in str(caught.value)


def test_the_client_app_builds_the_run_once_per_run_and_node(tmp_path, monkeypatch):
    """A long-lived ClientApp process answers a run's messages with the run it built for the first one;
    a new run gets its own."""
    from flwr.app import Context, RecordDict

    from fedge.deploy import client_app

    built: list[int] = []

    class Counted(client_app.Node):
        def __init__(self, config, client):
            built.append(client)
            super().__init__(config, client)

    monkeypatch.setattr(client_app, "Node", Counted)
    monkeypatch.setattr(client_app, "_BUILT", {})
    settings = {"config": config(tmp_path, "fedavg").to_yaml()}

    def node(run_id: int):
        return client_app._node(Context(run_id, 7, {"partition-id": 1}, RecordDict(), settings))

    first = node(11)
    assert node(11) is first and node(11) is first and built == [1]
    assert node(12) is not first and built == [1, 1] and node(12).client == 1


# ----- the runtime -----------------------------------------------------------------------------------


def on_demand(names, keep) -> list:
    """``names`` as parameters, those not in ``keep`` marked ``slow`` (run on demand, not in CI)."""
    return [name if name in keep else pytest.param(name, marks=pytest.mark.slow) for name in names]


@pytest.mark.deploy
@pytest.mark.parametrize("algorithm", on_demand(ALGORITHMS, ON_THE_RUNTIME))
def test_deployed_run_equals_the_simulation(federation, tmp_path, algorithm):
    cfg = config(tmp_path, algorithm, rounds=ROUNDS.get(algorithm, 2))
    deployed = federation.run(cfg, round_timeout=300)
    assert_equal_runs(deployed, simulate(cfg, tmp_path), algorithm)


@pytest.mark.deploy
def test_a_deployed_adversary_equals_the_simulation(federation, tmp_path):
    """On the runtime: the malicious node trains on its own backdoor-stamped samples, the server boosts
    its row at receipt and takes the median; the simulation's model, ledger and figures."""
    cfg = adversarial(tmp_path, "backdoor_median")
    deployed = federation.run(cfg, round_timeout=300)
    simulated = simulate(cfg, tmp_path)
    assert_equal_runs(deployed, simulated, "fedavg")
    rows = [json.loads(line) for line in (deployed / "metrics.jsonl").read_text().splitlines()]
    for key in ("malicious", "malicious_kept", "attack_success", "accuracy"):
        got = [r[key] for r in rows]
        assert got == pytest.approx([r[key] for r in simulated.metrics], abs=1e-6), key


def killed_in_round_two(federation: Federation, tmp_path: Path, algorithm: str) -> list[dict]:
    """Deploy 3 rounds of ``algorithm``, kill client 2's SuperNode once round 1 is recorded; the run's
    metrics rows (the run must complete, and round 3 must run without client 2)."""
    cfg = config(tmp_path, algorithm, rounds=3)
    outcome: dict[str, object] = {}

    def deploy() -> None:
        try:
            outcome["run_dir"] = federation.run(cfg, round_timeout=KILL_TIMEOUT)
        except Exception as error:  # reported by the assertion below
            outcome["error"] = error

    worker = threading.Thread(target=deploy)
    worker.start()
    metrics = tmp_path / "runs" / f"{algorithm}-digits" / "metrics.jsonl"
    while worker.is_alive() and not (metrics.is_file() and metrics.read_text().strip()):
        time.sleep(0.2)
    federation.kill_node("node2")  # round 1 is recorded: round 2 is under way
    worker.join()
    assert "error" not in outcome, outcome.get("error")
    rows = [json.loads(line) for line in (outcome["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3] and rows[0]["dropped"] == 0
    assert rows[2]["dropped_nodes"] == ["client:2"] and rows[2]["dropped"] == 1
    assert all(r["dropped_nodes"] in ([], ["client:2"]) for r in rows[1:])
    assert all(np.isfinite(r["accuracy"]) and np.isfinite(r["train_loss"]) for r in rows)
    dropped = json.loads((outcome["run_dir"] / "deploy.json").read_text())["dropped"]
    assert "no reply" in dropped["3"]["2"] or "error reply" in dropped["3"]["2"]
    return rows


@pytest.mark.deploy
@pytest.mark.slow  # the FedAvg run below takes the runtime's path; Gossip's rule runs in process above
def test_a_supernode_killed_in_round_two_drops_out_and_the_gossip_run_completes(federation, tmp_path):
    """A decentralized round: client 2 keeps its rows, its peers mix them in. Its node is started again
    afterwards (the SuperLink may still list the dead one: joining must not wait for it)."""
    rows = killed_in_round_two(federation, tmp_path, "gossip")
    assert rows[2]["mb_peer"] > rows[1]["mb_peer"] > rows[0]["mb_peer"]  # peers still send to client 2
    federation.add_node(2, NODES)


@pytest.mark.deploy
@pytest.mark.slow  # the runtime's path as FedAvg's below; the split rule: tests/deploy/test_split_deployed.py
def test_a_supernode_killed_in_round_two_drops_out_and_the_cse_fsl_run_completes(federation, tmp_path):
    """A split round: client 2 leaves rounds 2 and 3 (its row, weight and upload), the server model
    trains on the others' smashed data. Its node is started again afterwards."""
    rows = killed_in_round_two(federation, tmp_path, "cse_fsl")
    assert rows[2]["participants"] == NODES - 1 and rows[0]["participants"] == NODES
    federation.add_node(2, NODES)


@pytest.mark.deploy
def test_a_supernode_killed_in_round_two_drops_out_and_the_fedavg_run_completes(federation, tmp_path):
    """The runtime's dropout: a node gone mid-round costs the round timeout, the next round finds it
    unavailable, the run completes. Last test on the shared federation: it kills one of its nodes."""
    killed_in_round_two(federation, tmp_path, "fedavg")


@pytest.mark.deploy
def test_a_node_whose_port_is_taken_as_it_starts_is_started_again_on_another(tmp_path, monkeypatch):
    """A free port can be bound by another process between choosing it and the node binding it."""
    import socket

    from fedge.deploy import launch

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        pick = launch.free_port
        monkeypatch.setattr(launch, "free_port", lambda: next(ports, None) or pick())
        with Federation(tmp_path / "home").start() as fed:
            node = fed.add_node(0, 1)
            port = int(node.args[node.args.index("--port") + 1])
            assert port != taken.getsockname()[1] and node.poll() is None
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # its runtime API listens on the new port


@pytest.mark.deploy
def test_tls_with_node_authentication_refuses_an_unknown_key(tmp_path):
    tls = Tls.create(tmp_path / "tls")
    with Federation(tmp_path / "home", tls=tls).start() as fed:
        known, unknown = tls.node_key("known"), tls.node_key("unknown")
        fed.register(known, "known")
        stranger = fed.add_node(0, 1, key=unknown, name="stranger")
        assert stranger.wait(timeout=120) != 0  # refused by the SuperLink: the node gives up at once
        fed.add_node(0, 1, key=known)
        deployed = fed.run(config(tmp_path, "fedavg", rounds=1, clients=1), round_timeout=300)
    rows = (deployed / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 and json.loads(rows[0])["dropped"] == 0


def test_fedge_deploy_refuses_in_one_line_and_prints_the_run_summary(tmp_path, capsys):
    from typer.testing import CliRunner

    from fedge.cli.commands import app
    from fedge.cli.deploy import print_deployed

    path = tmp_path / "centralized.yaml"
    path.write_text("rounds: 1\ndata: {name: digits}\nalgorithm: {name: centralized}\n")
    refused = CliRunner().invoke(app, ["deploy", str(path)])
    assert refused.exit_code == 2
    assert refused.output.startswith("error: algorithm.name") and "no clients" in refused.output
    cfg = config(tmp_path, "gossip")
    print_deployed(run_deployed(cfg, lambda n: LoopbackTransport(cfg, n)).run_dir)
    shown = capsys.readouterr().out
    assert (
        "fedge · gossip on digits" in shown
        and "peer_model (peer)" in shown
        and "carried on the runtime" in shown
    )


class InProcess:
    """A stand-in for :class:`Federation` in ``fedge deploy``: its nodes answer in this process (the
    loopback transport), its run hands the rows to ``on_round`` as the real one does."""

    port = 9091

    def __init__(self, home, tls=None):
        self.nodes: list[int] = []

    def start(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def add_node(self, client, num_clients, key=None):
        self.nodes.append(client)

    def run(self, cfg, round_timeout, join_timeout, on_round):
        from fedge.deploy.launch import NewRows

        rows = NewRows(Path(cfg.output.dir), on_round)
        run_deployed(cfg, lambda n: LoopbackTransport(cfg, n))
        rows.read()
        return rows.run_dir()


def test_fedge_deploy_shows_the_superlink_each_supernode_and_each_round(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedge.cli.commands import app
    from fedge.deploy import launch

    monkeypatch.setattr(launch, "Federation", InProcess)
    path = tmp_path / "gossip.yaml"
    path.write_text(config(tmp_path, "gossip", rounds=3).to_yaml())
    shown = CliRunner().invoke(app, ["deploy", str(path), "--home", str(tmp_path / "home")])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    rounds = [f"round {t}/3" for t in (1, 2, 3)]  # every round, however fast
    order = ["SuperLink on 127.0.0.1:9091", "SuperNode 1/3", "SuperNode 3/3", *rounds]
    at = [next(i for i, line in enumerate(lines) if line.startswith(start)) for start in order]
    assert at == sorted(at) and "acc " in lines[at[-1]] and "fedge · gossip on digits" in shown.output
    quiet = CliRunner().invoke(app, ["deploy", str(path), "--quiet", "--home", str(tmp_path / "home")])
    assert quiet.exit_code == 0 and "round 1/3" not in quiet.output and "SuperNode" not in quiet.output
