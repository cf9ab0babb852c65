"""Malicious edge servers of a hierarchy (fedge.runtime.edge_adversary): an attacking edge's upload at
the cloud equals a hand computation from the model the cloud sent and the honest edges' uploads, a
sign-flipping edge ruins HFedAvg's mean at the cloud and a median or trimmed mean there keeps the
accuracy, HIST's disjoint neurons stay the malicious edge's whatever the cloud's reducer,
``malicious_edges_kept`` reads the cloud's reducer, both executors and HIST's two forms agree, a resumed
run repeats an uninterrupted one, edges that never attack change no number, and bad configs are refused
naming the key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fedge
from fedge.aggregation import Updates
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.runtime.adversary import alie_z

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import reduced, tiny, whole_and_resumed  # noqa: E402


def _config(tmp_path: Path, algorithm: str, adversary: dict | None, clients: int = 9, cells: int = 3,
            **options: Any) -> dict[str, Any]:  # fmt: skip
    config = tiny(algorithm, tmp_path / "runs")
    config["partition"]["num_clients"] = clients
    config["algorithm"].update(cells=cells, **options)
    if adversary is not None:
        config["adversary"] = adversary
    return config


def _rows(updates: Updates) -> dict[str, torch.Tensor]:
    return {k: v for k, v in updates.parts[0].rows.items() if v.is_floating_point()}


@pytest.mark.parametrize("attack", ["sign_flip", "scaling", "alie"])
def test_an_attacking_edges_upload_is_poisoned_from_the_cloud_model_and_honest_edges(
    tmp_path, monkeypatch, attack
):
    honest, _ = reduced(monkeypatch, _config(tmp_path, "hfedavg", None, clients=16, cells=4), "cloud")
    options = {"scale": 2.0} if attack == "sign_flip" else {}
    adversary = {"edges": [1, 3], "attack": attack, "options": options}
    attacked, result = reduced(monkeypatch, _config(tmp_path, "hfedavg", adversary, 16, 4), "cloud")
    first = attacked[0]  # round 1: the same start, so the honest run's uploads are the trained ones
    for name, rows in _rows(first).items():
        ref, trained = first.reference[name], honest[0].parts[0].rows[name]
        others = torch.stack([trained[j] - ref for j in (0, 2)]).double()
        for j in range(4):
            if j in (0, 2):
                assert torch.equal(rows[j], trained[j])
            elif attack == "sign_flip":
                assert torch.allclose(rows[j], ref - 2.0 * (trained[j] - ref), atol=1e-6)
            elif attack == "scaling":  # the default scale: 4 edges over 2 attacking
                assert torch.allclose(rows[j], ref + 2.0 * (trained[j] - ref), atol=1e-6)
            else:
                want = ref + others.mean(0) - alie_z(4, 2) * others.std(0, correction=1)
                assert torch.allclose(rows[j].double(), want, atol=1e-5)
    assert [m["malicious_edges"] for m in result.metrics] == [2, 2]
    assert result.metrics[0]["malicious_edges_kept"] == pytest.approx(0.5)  # the mean keeps 2 of 4
    assert "malicious" not in result.metrics[0]  # no malicious member
    assert result.summary["malicious_edges"] == 4 and result.summary["malicious_edges_kept"] == 0.5


def _digits(tmp_path: Path, algorithm: str, stages: list[Any], attacked: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": 4,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 12},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": algorithm, "cells": 3, "split": "partition", "edge_rounds": 2,
                      "local_steps": 5, "batch_size": 16, "optimizer": {"lr": 0.1}},
        "aggregation": {"stages": stages},
        "output": {"dir": str(tmp_path), "plots": False},
    }  # fmt: skip
    if attacked:  # edge 1 of 3 flips its change at scale 4
        config["adversary"] = {"edges": [1], "attack": "sign_flip", "options": {"scale": 4.0}}
    return fedge.run(config).summary


def test_sign_flipping_edge_breaks_the_clouds_mean_not_a_median_or_trimmed_mean(tmp_path):
    clean = _digits(tmp_path, "hfedavg", [], False)["final_accuracy"]
    mean = _digits(tmp_path, "hfedavg", [], True)
    assert mean["final_accuracy"] < clean - 0.4 and mean["malicious_edges_kept"] == pytest.approx(1 / 3)
    for stage in ({"name": "median"}, {"name": "trimmed_mean", "options": {"trim": 1}}):
        robust = _digits(tmp_path, "hfedavg", [{**stage, "at": ["cloud"]}], True)
        assert robust["final_accuracy"] > clean - 0.1
        assert robust["malicious_edges_kept"] < 0.1


@pytest.mark.ci
def test_hists_disjoint_neurons_stay_the_malicious_edges(tmp_path):
    clean = _digits(tmp_path, "hist", [{"name": "median", "at": ["cloud"]}], False)["final_accuracy"]
    median = _digits(tmp_path, "hist", [{"name": "median", "at": ["cloud"]}], True)
    assert median["final_accuracy"] < clean - 0.3  # the cloud's median reaches the shared bias alone
    assert median["malicious_edges_kept"] > 0.3  # its third of the neurons, kept whole


def test_hist_forms_give_the_same_attacked_run(tmp_path):
    adversary = {"edges": [0], "attack": "gaussian", "options": {"sigma": 0.1}}
    runs = [fedge.run(_config(tmp_path, "hist", adversary, form=f)) for f in ("compact", "masked")]
    assert runs[0].summary["final_loss"] == pytest.approx(runs[1].summary["final_loss"], rel=1e-6)
    assert runs[0].metrics[-1]["accuracy"] == pytest.approx(runs[1].metrics[-1]["accuracy"], abs=1e-6)


def test_hist_edges_kept_share_counts_their_neurons_whole(tmp_path, monkeypatch):
    adversary = {"edges": [2], "attack": "free_rider"}
    config = _config(tmp_path, "hist", adversary)
    config["aggregation"] = {"stages": [{"name": "krum", "at": ["cloud"]}]}
    _, result = reduced(monkeypatch, config, "cloud")
    # an MLP 36-16-4 over 3 cells: the cloud reduces the output bias (4 values), krum keeps one row of
    # it; the malicious edge alone holds its 5 or 6 of the 16 neurons, 36 + 1 + 4 values each
    kept = result.metrics[0]["malicious_edges_kept"]
    assert any(kept == pytest.approx((4 * k + n * 41) / (4 + 16 * 41)) for k in (0, 1) for n in (5, 6))


@pytest.mark.parametrize(("algorithm", "attack"), [("hfedavg", "ipm"), ("hist", "gaussian")])
def test_both_executors_poison_edges_alike(tmp_path, monkeypatch, algorithm, attack):
    adversary = {"edges": 0.3, "attack": attack, "clients": [0], "start_round": 2}
    runs = []
    for executor in ("sequential", "batched"):
        config = _config(tmp_path, algorithm, adversary, edge_rounds=2)
        config["rounds"] = 3
        config["engine"] = {"executor": executor}
        runs.append(reduced(monkeypatch, config, "cloud"))
    (seq, first), (bat, second) = runs
    for a, b in zip(seq, bat, strict=True):
        for name, rows in _rows(a).items():
            assert torch.allclose(rows.double(), b.parts[0].rows[name].double(), atol=1e-5)
    assert [m["malicious_edges"] for m in first.metrics] == [0, 1, 1]  # round(0.3 * 3) = 1 edge
    assert [m["malicious"] for m in first.metrics] == [0, 2, 2]  # and member 0, two edge rounds
    assert first.metrics[-1]["accuracy"] == pytest.approx(second.metrics[-1]["accuracy"], abs=1e-6)


def test_resumed_run_repeats_the_uninterrupted_one(tmp_path):
    adversary = {"edges": [1], "attack": "gaussian", "options": {"sigma": 0.05}}

    def config_of(out: Path) -> dict[str, Any]:
        config = _config(out, "hfedavg", adversary)
        config["aggregation"] = {"stages": [{"name": "median", "at": ["cloud"]}]}
        config["output"]["dir"] = str(out)
        return config

    whole, resumed = whole_and_resumed(config_of, tmp_path, rounds=3, after=1)
    keys = ("loss", "accuracy", "malicious_edges", "malicious_edges_kept")
    assert [[m[k] for k in keys] for m in whole.metrics] == [[m[k] for k in keys] for m in resumed.metrics]


@pytest.mark.parametrize("algorithm", ["hfedavg", "hist"])
def test_edges_that_never_attack_change_no_number(tmp_path, algorithm):
    plain = fedge.run(_config(tmp_path, algorithm, None))
    late = fedge.run(_config(tmp_path, algorithm, {"edges": [0, 2], "attack": "sign_flip", "start_round": 9}))
    drop = ("wall_seconds", "malicious_edges", "malicious_edges_kept")
    assert [{k: v for k, v in r.items() if k not in drop} for r in plain.metrics] == [
        {k: v for k, v in r.items() if k not in drop} for r in late.metrics
    ]
    assert [m["malicious_edges"] for m in late.metrics] == [0, 0] and "malicious_edges" not in plain.summary
    assert late.summary["malicious_edges_kept"] is None


@pytest.mark.parametrize(
    ("algorithm", "adversary", "key", "words"),
    [
        ("fedavg", {"edges": [0], "attack": "ipm", "clients": [0]}, "adversary.edges", "hist and hfedavg"),
        ("gossip", {"edges": [0], "attack": "sign_flip"}, "adversary.edges", "not gossip"),
        ("hfedavg", {"edges": [0], "attack": "label_flip"}, "adversary.attack", "training data"),
        ("hist", {"edges": [0], "attack": "label_flip", "clients": [1]}, "adversary.attack", "training data"),
        ("hist", {"edges": [0], "attack": "alie"}, "adversary.attack", "disjoint"),
        ("hist", {"edges": [0], "attack": "min_max"}, "adversary.attack", "disjoint"),
        ("hfedavg", {"attack": "sign_flip"}, "adversary.clients", "name the malicious clients"),
        ("fedavg", {"attack": "sign_flip"}, "adversary.clients", "name the malicious clients"),
    ],
)  # fmt: skip
def test_bad_edge_adversaries_are_refused_naming_the_key(algorithm, adversary, key, words):
    with pytest.raises(ConfigError) as error:
        parse_config({"algorithm": {"name": algorithm}, "adversary": adversary})
    assert error.value.key == key and words in str(error.value)


def test_an_edge_beyond_the_cells_is_refused(tmp_path):
    assert parse_config({"algorithm": {"name": "hfedavg"}, "adversary": {"edges": 0.5, "attack": "ipm"}})
    with pytest.raises(ConfigError) as error:
        fedge.run(_config(tmp_path, "hfedavg", {"edges": [3], "attack": "sign_flip"}))
    assert error.value.key == "adversary.edges" and "not among the 3 cells" in str(error.value)
    with pytest.raises(Exception, match="distinct ids"):
        parse_config({"algorithm": {"name": "hfedavg"}, "adversary": {"edges": [], "attack": "ipm"}})
