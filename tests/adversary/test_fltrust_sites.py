"""FLTrust beyond the star server (fedge.aggregation.fltrust, fedge.runtime.root): at a hierarchy's edges
per-receiver rows against each output's own root model equal one star FLTrust per output, each edge's
root set is its own and seeded, sign-flipping members are given no trust on digits, both executors and
HIST's two forms agree; at FedBuff's buffer scaled updates lose their boost, both executors agree and a
resumed run repeats the uninterrupted one; at HFedAvg's cloud it is the paper's formula and gives a
sign-flipping edge no trust, at peers each peer's own update scores what it receives (a per-peer loop of
the star rule), in FedAsync a sign-flipped update is let in by no trust, both executors agree there; the
sites and options it cannot take are refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedge
from fedge.aggregation import Updates, build_pipeline
from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.config import AggregationConfig
from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.errors import ConfigError
from fedge.extend import parse_config
from fedge.runtime.root import edge_root_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import tiny, whole_and_resumed  # noqa: E402

EDGE = {"name": "fltrust", "at": ["edge"]}


def _reducer(site: str) -> tuple[Any, FLTrust]:
    pipeline = build_pipeline(AggregationConfig.model_validate({"stages": [{**EDGE, "at": [site]}]}), site)
    assert isinstance(pipeline.reducer, FLTrust)
    return pipeline, pipeline.reducer


def test_each_edge_is_measured_against_its_own_root_model():
    gen = torch.Generator().manual_seed(0)
    rows = {"w": torch.randn(6, 3, 2, generator=gen)}  # two cells of three members
    reference = {"w": torch.randn(2, 3, 2, generator=gen)}  # each cell's broadcast
    roots = {"w": reference["w"] + torch.randn(2, 3, 2, generator=gen)}
    rows["w"][1] = 2 * reference["w"][0] - roots["w"][0]  # against its own edge's root direction
    weights = torch.zeros(2, 6, dtype=torch.float64)
    weights[0, :3] = weights[1, 3:] = 1 / 3
    pipeline, reducer = _reducer("edge")
    reducer.root = RootUpdate(roots, 0.0, per_output=True)
    out = pipeline.reduce(Updates.of("edge", 1, rows, weights, reference, tuple(range(6))))
    for cell in (0, 1):
        star, one = _reducer("server")
        one.root = RootUpdate({"w": roots["w"][cell]}, 0.0)
        members = slice(3 * cell, 3 * cell + 3)
        alone = star.reduce(
            Updates.of("server", 1, {"w": rows["w"][members]}, torch.full((3,), 1 / 3, dtype=torch.float64),
                       {"w": reference["w"][cell]})
        )  # fmt: skip
        assert torch.allclose(out["w"][cell], alone["w"], atol=1e-6)
        assert reducer.reports[cell].kept == pytest.approx(one.reports[0].kept, abs=1e-9)
    assert reducer.reports[0].kept[1] == 0.0


def test_each_edges_root_set_is_its_own_and_seeded():
    x, y = torch.rand(60, 1, 2, 2), torch.arange(60) % 3
    dataset = Dataset("toy", x, y, x[:6].clone(), y[:6].clone(), num_classes=3)
    data = FederatedData(dataset, [np.arange(30), np.arange(30, 60)], [np.arange(6)] * 2, seed=0)
    sets = edge_root_data(data, 3, 20, 3, "aggregation.stages.0").client_train
    again = edge_root_data(data, 3, 20, 3, "k").client_train
    assert all(np.array_equal(a, b) for a, b in zip(sets, again, strict=True)) and len(sets) == 3
    assert not np.array_equal(sets[0], sets[1]) and all(len(np.unique(s)) == 20 for s in sets)
    with pytest.raises(ConfigError, match=r"^aggregation.stages.0.options.root_samples: 61 is more"):
        edge_root_data(data, 3, 61, 3, "aggregation.stages.0")


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
    if attacked:  # one member of every cell flips its change at scale 4
        config["adversary"] = {"clients": [0, 4, 8], "attack": "sign_flip", "options": {"scale": 4.0}}
    return fedge.run(config).summary


@pytest.mark.parametrize("algorithm", ["hfedavg", pytest.param("hist", marks=pytest.mark.ci)])
def test_fltrust_at_the_edges_gives_sign_flippers_no_trust(tmp_path, algorithm):
    clean = _digits(tmp_path, algorithm, [], False)["final_accuracy"]
    mean = _digits(tmp_path, algorithm, [], True)["final_accuracy"]
    trusted = _digits(tmp_path, algorithm, [EDGE], True)
    assert mean < clean - 0.3 and trusted["final_accuracy"] > clean - 0.06
    assert trusted["malicious_kept"] == 0.0


def _tiny(tmp_path: Path, algorithm: str, **options: Any) -> dict[str, Any]:
    config = tiny(algorithm, tmp_path / "runs")
    config["partition"]["num_clients"] = 9
    config["algorithm"].update(cells=3, edge_rounds=2, **options)
    config["aggregation"] = {"stages": [{**EDGE, "options": {"root_samples": 30}}]}
    config["adversary"] = {"clients": [1], "attack": "gaussian"}
    return config


@pytest.mark.parametrize("algorithm", ["hfedavg", "hist"])
def test_both_executors_agree(tmp_path, algorithm):
    runs = []
    for executor in ("sequential", "batched"):
        config = _tiny(tmp_path / executor, algorithm)
        config["engine"] = {"executor": executor}
        runs.append(fedge.run(config).metrics[-1])
    assert runs[0]["accuracy"] == pytest.approx(runs[1]["accuracy"], abs=1e-6)
    assert runs[0]["loss"] == pytest.approx(runs[1]["loss"], rel=1e-5)
    assert runs[0]["malicious_kept"] == pytest.approx(runs[1]["malicious_kept"], abs=1e-6)


def test_hist_forms_agree(tmp_path):
    runs = [fedge.run(_tiny(tmp_path / f, "hist", form=f)).summary for f in ("compact", "masked")]
    assert runs[0]["final_loss"] == pytest.approx(runs[1]["final_loss"], rel=1e-5)


CLOUD = {"name": "fltrust", "at": ["cloud"]}


def test_the_clouds_fltrust_is_the_papers_formula():
    gen = torch.Generator().manual_seed(2)
    rows = {"w": torch.randn(3, 4, 2, generator=gen), "b": torch.randn(3, 2, generator=gen)}
    reference = {"w": torch.randn(4, 2, generator=gen), "b": torch.randn(2, generator=gen)}
    root = {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in reference.items()}
    rows["w"][2], rows["b"][2] = 2 * reference["w"] - root["w"], 2 * reference["b"] - root["b"]
    pipeline, reducer = _reducer("cloud")
    reducer.root = RootUpdate(root, 5.0)
    weights = torch.full((3,), 1 / 3, dtype=torch.float64)
    out = pipeline.reduce(Updates.of("cloud", 1, rows, weights, reference))

    def flat(t: dict[str, torch.Tensor], one: bool = False) -> torch.Tensor:
        t = {k: v[None] for k, v in t.items()} if one else t
        return torch.cat([t[k].reshape(len(t[k]), -1) for k in ("w", "b")], 1).double()

    g = flat(rows) - flat(reference, True)
    g0 = (flat(root, True) - flat(reference, True))[0]
    trust = torch.relu(g @ g0 / (g.norm(dim=1) * g0.norm()))
    want = (trust[:, None] * g * g0.norm() / g.norm(dim=1, keepdim=True)).sum(0) / trust.sum()
    got = torch.cat([(out[k] - reference[k]).reshape(-1) for k in ("w", "b")]).double()
    assert torch.allclose(got, want, atol=1e-5) and trust[2] == 0.0
    assert reducer.reports[0].kept[2] == 0.0 and reducer.reports[0].flops == (6 * 3 + 2) * 10 + 5.0


def _edges(tmp_path: Path, stages: list[Any], attacked: bool, algorithm: str = "hfedavg") -> dict[str, Any]:
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
    if attacked:  # edge 1 of 3 flips its cell's change at scale 4
        config["adversary"] = {"edges": [1], "attack": "sign_flip", "options": {"scale": 4.0}}
    return config


def test_fltrust_at_the_cloud_gives_a_sign_flipping_edge_no_trust(tmp_path):
    clean = fedge.run(_edges(tmp_path, [], False)).summary["final_accuracy"]
    mean = fedge.run(_edges(tmp_path, [], True)).summary["final_accuracy"]
    trusted = fedge.run(_edges(tmp_path, [CLOUD], True)).summary
    assert mean < clean - 0.5 and trusted["final_accuracy"] > clean - 0.03
    assert trusted["malicious_edges_kept"] == 0.0


def test_the_clouds_executors_agree_and_its_root_training_is_charged(tmp_path):
    runs = []
    for executor in ("sequential", "batched"):
        config = _edges(tmp_path / executor, [CLOUD], True)
        config.update(rounds=2, engine={"executor": executor})
        runs.append(fedge.run(config).metrics)
    for a, b in zip(*runs, strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
        assert a["malicious_edges_kept"] == b["malicious_edges_kept"] == 0.0
    plain = _edges(tmp_path / "mean", [], True)
    plain["rounds"] = 2
    assert runs[0][-1]["sim_seconds"] > fedge.run(plain).metrics[-1]["sim_seconds"]


def test_hists_cloud_is_refused():
    config = _edges(Path("unused"), [CLOUD], False, algorithm="hist")
    with pytest.raises(ConfigError, match=r"^aggregation.stages.0.at: fltrust at HIST's cloud") as error:
        fedge.run(config)
    assert "\n" not in str(error.value)


PEER = {"name": "fltrust", "at": ["peer"]}


def test_each_peer_scores_against_its_own_update_from_its_own_start():
    gen = torch.Generator().manual_seed(3)
    start = {"w": torch.randn(4, 5, generator=gen)}  # each peer's model before the round
    rows = {"w": start["w"] + 0.5 * torch.randn(4, 5, generator=gen)}  # the trained rows, own first
    rows["w"][3] = 2 * start["w"][0] - rows["w"][0]  # against peer 0's own update
    weights = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.float64)
    weights = weights / weights.sum(1, keepdim=True)  # outputs of 4, 2, 3 and 3 rows: three groups
    pipeline, reducer = _reducer("peer")
    own = {"w": rows["w"].clone()}
    reducer.root = RootUpdate(own, 0.0, per_output=True, start=start)
    out = pipeline.reduce(Updates.of("peer", 1, rows, weights, {"w": rows["w"].clone()}, tuple(range(4))))
    for i in range(4):
        star, one = _reducer("server")
        one.root = RootUpdate({"w": own["w"][i]}, 0.0)
        chosen = weights[i] > 0
        alone = star.reduce(
            Updates.of("server", 1, {"w": rows["w"][chosen]}, weights[i][chosen], {"w": start["w"][i]})
        )
        assert torch.allclose(out["w"][i], alone["w"], atol=1e-6)
    assert reducer.reports[0].kept[3] == 0.0 and reducer.root is None


def _peers(tmp_path: Path, stages: list[Any], attacked: bool, executor: str = "batched",
           algorithm: str = "gossip") -> dict[str, Any]:  # fmt: skip
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": 3,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": algorithm, "optimizer": {"lr": 0.1}},
        "aggregation": {"stages": stages},
        "engine": {"executor": executor, "threads": 1},
        "output": {"dir": str(tmp_path / executor), "plots": False},
    }
    if attacked:  # peers 2 and 7 flip their change at scale 4
        config["adversary"] = {"clients": [2, 7], "attack": "sign_flip", "options": {"scale": 4.0}}
    return config


def test_fltrust_at_peers_gives_sign_flippers_no_trust(tmp_path):
    clean = fedge.run(_peers(tmp_path / "clean", [], False)).summary["final_accuracy"]
    mean = fedge.run(_peers(tmp_path / "mean", [], True)).summary["final_accuracy"]
    trusted = fedge.run(_peers(tmp_path / "trusted", [PEER], True)).summary
    assert mean < clean - 0.2 and trusted["final_accuracy"] > clean - 0.03
    assert trusted["malicious_kept"] == 0.0


def test_the_peers_executors_agree(tmp_path):
    runs = [fedge.run(_peers(tmp_path, [PEER], True, e)).metrics for e in ("batched", "sequential")]
    for a, b in zip(*runs, strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["malicious_kept"] == b["malicious_kept"] == 0.0


def test_fedfomos_older_models_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^aggregation.stages.0.at: fltrust at peers needs this round's"):
        fedge.run(_peers(tmp_path, [PEER], False, algorithm="fedfomo"))


@pytest.mark.parametrize(
    ("algorithm", "stage", "key"),
    [
        ("hfedavg", {**CLOUD, "options": {"root_epochs": 2}}, "aggregation.stages.0.options.root_epochs"),
        ("gossip", {**PEER, "options": {"lr": 0.1}}, "aggregation.stages.0.options.lr"),
        ("hfedavg", {**EDGE, "options": {"root_epochs": 2}}, "aggregation.stages.0.options.root_epochs"),
    ],
)
def test_sites_and_options_it_cannot_take_are_refused(algorithm, stage, key):
    with pytest.raises(ConfigError) as error:
        parse_config({"algorithm": {"name": algorithm}, "aggregation": {"stages": [stage]}})
    assert error.value.key == key and "\n" not in str(error.value)


def test_aircomp_edges_cannot_take_it(tmp_path):
    config = _tiny(tmp_path, "hfedavg", aggregation="aircomp")
    with pytest.raises(ConfigError, match="^aggregation.stages: AirComp sums over the air"):
        fedge.run(config)


def _buffer(out: Path, stages: list[Any], attacked: bool, rounds: int = 10) -> dict[str, Any]:
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": rounds,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": "fedbuff", "optimizer": {"lr": 0.1}, "fraction": 1.0, "buffer_size": 5},
        "aggregation": {"stages": stages},
        "output": {"dir": str(out), "plots": False},
    }
    if attacked:  # clients 0 and 1 boost their deltas 20 times
        config["adversary"] = {"clients": [0, 1], "attack": "scaling", "options": {"scale": 20.0}}
    return config


BUFFER = {"name": "fltrust", "at": ["buffer"]}


def test_fltrust_at_the_buffer_takes_the_boost_out_of_scaled_updates(tmp_path):
    mean = fedge.run(_buffer(tmp_path, [], True)).summary["final_accuracy"]
    clean = fedge.run(_buffer(tmp_path, [BUFFER], False)).summary["final_accuracy"]
    trusted = fedge.run(_buffer(tmp_path, [BUFFER], True)).summary["final_accuracy"]
    assert mean < clean - 0.2 and trusted > clean - 0.05


def test_buffer_executors_agree_and_a_resumed_run_repeats(tmp_path):
    runs = []
    for executor in ("sequential", "batched"):
        config = _buffer(tmp_path / executor, [BUFFER], True, rounds=3)
        config["engine"] = {"executor": executor}
        runs.append(fedge.run(config).metrics)
    for a, b in zip(*runs, strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
        assert a["malicious_kept"] == pytest.approx(b["malicious_kept"], abs=1e-6)
    whole, resumed = whole_and_resumed(lambda out: _buffer(out, [BUFFER], True), tmp_path / "cut", 3, 1)
    keys = ("loss", "accuracy", "malicious_kept")
    assert [[m[k] for k in keys] for m in whole.metrics] == [[m[k] for k in keys] for m in resumed.metrics]


def _fedasync(out: Path, stages: list[Any], attacked: bool, rounds: int = 60) -> dict[str, Any]:
    config = _buffer(out, stages, attacked, rounds)
    config["algorithm"] = {"name": "fedasync", "optimizer": {"lr": 0.1}, "fraction": 1.0,
                           "staleness": "constant", "mixing": 0.5}  # fmt: skip
    if attacked:  # clients 0 and 1 flip their change at scale 4
        config["adversary"] = {"clients": [0, 1], "attack": "sign_flip", "options": {"scale": 4.0}}
    return config


def test_fltrust_in_fedasync_lets_no_sign_flipped_update_in(tmp_path):
    clean = fedge.run(_fedasync(tmp_path, [], False)).summary["final_accuracy"]
    mean = fedge.run(_fedasync(tmp_path, [], True)).summary
    trusted = fedge.run(_fedasync(tmp_path, [BUFFER], True)).summary
    assert mean["final_accuracy"] < clean - 0.4 and mean["malicious_kept"] == 0.5
    assert trusted["final_accuracy"] > clean - 0.03 and trusted["malicious_kept"] == 0.0


def test_fedasyncs_executors_agree_and_a_resumed_run_repeats(tmp_path):
    runs = []
    for executor in ("sequential", "batched"):
        config = _fedasync(tmp_path / executor, [BUFFER], True, rounds=4)
        config["engine"] = {"executor": executor}
        runs.append(fedge.run(config).metrics)
    for a, b in zip(*runs, strict=True):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-6)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a.get("malicious_kept") == b.get("malicious_kept")
    whole, resumed = whole_and_resumed(lambda out: _fedasync(out, [BUFFER], True, 4), tmp_path / "cut", 4, 2)
    keys = ("loss", "accuracy", "malicious_kept")
    figures = [[[m.get(k) for k in keys] for m in run.metrics] for run in (whole, resumed)]
    assert figures[0] == figures[1]
