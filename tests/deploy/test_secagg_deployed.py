"""The ``secagg`` stage of a deployed FedAvg run on Flower's own SecAgg+ (fedge.deploy.secagg,
fedge.deploy.secagg_round): its options map onto the workflow's settings or are refused in one line
naming the key (fast, in process), and a loopback deployment of 3 nodes and 2 rounds (``deploy``
marker) ends within the quantization bound of the plain run, while the server app saw masked vectors
only and put the protocol's messages on the ledger."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from cases import final_state  # noqa: E402

from fedge import run  # noqa: E402
from fedge.aggregation.secure_protocol import default_threshold  # noqa: E402
from fedge.api import resolve_config  # noqa: E402
from fedge.deploy.launch import Federation  # noqa: E402
from fedge.deploy.loopback import LoopbackTransport  # noqa: E402
from fedge.deploy.rounds import check_stages  # noqa: E402
from fedge.deploy.secagg import secagg_options  # noqa: E402
from fedge.deploy.server_app import run_deployed  # noqa: E402
from fedge.errors import ConfigError  # noqa: E402

NODES = 3
D = 64 * 32 + 32 + 32 * 10 + 10  # the digits MLP's coordinates (hidden layer of 32)


def config(tmp: Path, stages: list, algorithm: dict | None = None, clients: int = NODES, **extra):
    return resolve_config(
        {
            "seed": 3,
            "rounds": 2,
            "data": {"name": "digits"},
            "partition": {"kind": "iid", "num_clients": clients},
            "model": {"name": "mlp", "options": {"hidden": [32]}},
            "algorithm": algorithm or {"name": "fedavg", "batch_size": 64},
            "aggregation": {"stages": stages},
            "engine": {"executor": "sequential", "threads": 1},
            "output": {"dir": str(tmp / "runs"), "plots": False},
            **extra,
        }
    )


def secagg(**options) -> dict:
    return {"name": "secagg", "options": options}


def test_the_options_map_onto_flowers_workflow_settings(tmp_path):
    ring = secagg_options(config(tmp_path, [secagg(bits=16, range=4.0, neighbours=2, threshold=2)]))
    got = ring.settings(5, 300.0)
    assert got == {
        "num_shares": 3,  # a sender and its 2 neighbours on Flower's ring
        "reconstruction_threshold": 2,
        "clipping_range": 4.0,
        "quantization_range": (2**16 - 1) // 5,
        "modulus_range": 2**16,
        "max_weight": 300.0,
    }
    assert 5 * got["quantization_range"] < got["modulus_range"]  # the sum of 5 quantized rows cannot wrap
    whole = secagg_options(config(tmp_path, [secagg()])).settings(NODES, 600.0)
    assert whole["num_shares"] == 1.0 and whole["modulus_range"] == 2**32  # every sender: Flower's 1.0
    assert (
        whole["reconstruction_threshold"] == default_threshold(NODES - 1) and whole["clipping_range"] == 8.0
    )
    assert secagg_options(config(tmp_path, [])) is None


REFUSED = [
    ([secagg(bits=40)], {}, r"aggregation\.stages\.0\.options\.bits"),
    ([secagg(dropout=0.25)], {}, r"aggregation\.stages\.0\.options\.dropout"),
    ([secagg(rounding="nearest")], {}, r"aggregation\.stages\.0\.options\.rounding"),
    ([secagg(threshold=1)], {}, r"aggregation\.stages\.0\.options\.threshold"),
    ([secagg(bits=70)], {}, r"aggregation\.stages\.0\.options"),  # the stage's own check
    ([{"name": "clip", "options": {"clip": 1.0}}, secagg()], {}, r"aggregation\.stages\.0\.name"),
    ([secagg()], {"algorithm": {"name": "gossip", "peers": 2}}, r"aggregation\.stages\.0\.name"),
    ([secagg()], {"adversary": {"clients": 0.25, "attack": "sign_flip"}}, r"^adversary"),
    (
        [secagg()],
        {"algorithm": {"name": "fedavg", "client_optimizer_state": "keep"}},
        r"algorithm\.client_optimizer_state",
    ),
]


@pytest.mark.parametrize(("stages", "extra", "key"), REFUSED)
def test_what_cannot_map_is_refused_in_one_line_naming_the_key(tmp_path, stages, extra, key):
    with pytest.raises(ConfigError, match=key) as caught:
        check_stages(config(tmp_path, stages, **extra))
    assert "\n" not in str(caught.value)


def test_a_threshold_flower_cannot_take_and_a_run_without_a_grid_are_refused(tmp_path):
    options = secagg_options(config(tmp_path, [secagg(neighbours=2, threshold=3)]))
    with pytest.raises(ConfigError, match=r"aggregation\.stages\.0\.options\.threshold"):
        options.settings(5, 100.0)  # 3 holders: Flower needs fewer shares than holders
    with pytest.raises(ConfigError, match=r"algorithm\.fraction"):
        options.settings(1, 100.0)
    with pytest.raises(ConfigError, match=r"aggregation\.stages\.0\.options\.threshold"):
        check_stages(config(tmp_path, [secagg(neighbours=2, threshold=3)], clients=5))  # before any start
    with pytest.raises(ConfigError, match=r"algorithm\.fraction"):
        check_stages(config(tmp_path, [secagg()], {"name": "fedavg", "fraction": 0.3}))
    cfg = config(tmp_path, [secagg()])
    with pytest.raises(ConfigError, match=r"aggregation\.stages\.0\.name.*runtime only"):
        run_deployed(cfg, lambda n: LoopbackTransport(cfg, n))


def carried_up(run_dir: Path) -> dict[str, int]:
    """Bytes the nodes sent the server app, by record."""
    out: dict[str, int] = {}
    with (run_dir / "carried.csv").open() as rows:
        for row in csv.DictReader(rows):
            if row["dst"] == "server":
                out[row["kind"]] = out.get(row["kind"], 0) + int(row["bytes"])
    return out


def ledger(run_dir: Path) -> dict[str, int]:
    """Bits by kind on a run's ledger."""
    out: dict[str, int] = {}
    with (run_dir / "ledger.csv").open() as rows:
        for row in csv.DictReader(rows):
            out[row["kind"]] = out.get(row["kind"], 0) + int(row["bits"])
    return out


@pytest.mark.deploy
def test_a_deployed_secagg_run_uses_flowers_secaggplus_and_ends_within_the_quantization_bound(tmp_path):
    cfg = config(tmp_path, [secagg()])
    with Federation(tmp_path / "flwr-home").start() as federation:
        for client in range(NODES):
            federation.add_node(client, NODES)
        deployed = federation.run(cfg, round_timeout=300)
    plain = run(config(tmp_path / "plain", []))
    simulated = run(config(tmp_path / "simulated", [secagg()]))
    got, want, sim = final_state(deployed), final_state(plain.run_dir), final_state(simulated.run_dir)
    gap = max(float((got[k].double() - want[k].double()).abs().max()) for k in want)
    sim_gap = max(float((got[k].double() - sim[k].double()).abs().max()) for k in want)
    # one aggregation: 3 rows of step 2 * 8 / ((2^32 - 1) // 3) = 1.1e-8 each, over weights summing to
    # about 3; round 2 trains from round 1's mean, which the local steps carry on at most a few times
    assert 0.0 < gap < 1e-6 and sim_gap < 1e-6
    summary = json.loads((deployed / "deploy.json").read_text())
    rounds = summary["secagg"]
    assert [r["round"] for r in rounds] == [1, 2] and all(r["senders"] == [0, 1, 2] for r in rounds)
    assert all(r["dropped"] == [] for r in rounds)
    # the server app held masked vectors: most coordinates lie above any quantized row's largest value
    assert all(r["masked_above_quantization"] > 0.5 for r in rounds)
    up = carried_up(deployed)
    assert up["fitres.parameters"] == 0 and "params" not in up  # the mod emptied every ArrayRecord
    assert up["secagg.collect_masked_vectors"] >= 2 * NODES * D * 8  # Flower's int64 arrays
    books = ledger(deployed)
    assert "model_up" not in books and books["model_down"] == ledger(plain.run_dir)["model_down"]
    formula = rounds[0]["simulated_formula"]
    assert books["secagg_masked"] == 2 * NODES * (D + 1) * 32  # the weight factor: one coordinate more
    assert formula["secagg_masked"] == NODES * D * 32
    assert all(books[k] > 0 for k in ("secagg_setup", "secagg_keys", "secagg_shares", "secagg_unmask"))
    rows = [json.loads(line) for line in (deployed / "metrics.jsonl").read_text().splitlines()]
    assert all(r["dropped"] == 0 and torch.isfinite(torch.tensor(r["train_loss"])) for r in rows)
