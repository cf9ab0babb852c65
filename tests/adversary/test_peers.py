"""Malicious peers (fedge.runtime.peer_adversary) and ClippedGossip (fedge.aggregation.clipped_gossip):
the clipped mix equals a per-peer loop and plain gossip at an infinite radius, sign flipping peers hurt
gossip and not ClippedGossip, AFIND+ takes in fewer poisoners when they poison their probes too, both
executors agree, an adversary that never attacks changes no number, FedFomo scores a poisoner's model as
sent (and keeps little of it), Dis-PFL's poisoned sparse models hurt, and bad configs are refused."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedge
from fedge.aggregation import Updates, build_pipeline, sites
from fedge.config import AdversaryConfig, AggregationConfig, parse_config
from fedge.errors import ConfigError
from fedge.runtime.adversary import Adversary
from fedge.runtime.peer_adversary import PeerAdversary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import final_state, tiny  # noqa: E402

N = 5


def _peer_updates(seed: int = 0) -> tuple[Updates, dict[str, torch.Tensor], torch.Tensor]:
    """Five peers' rows (one an outlier), a sparse row-stochastic mixing matrix with the diagonal set."""
    g = torch.Generator().manual_seed(seed)
    rows = {"w": torch.randn(N, 3, 2, generator=g).double(), "b": torch.randn(N, 4, generator=g).double()}
    rows["w"][3] += 20.0
    weights = (torch.rand(N, N, generator=g) * (torch.rand(N, N, generator=g) > 0.3)).double()
    weights.fill_diagonal_(0.5)
    weights = weights / weights.sum(dim=1, keepdim=True)
    return Updates.of(sites.PEER, 1, rows, weights, reference=rows), rows, weights


def _reduce(updates: Updates, **options: Any) -> dict[str, torch.Tensor]:
    stage = {"name": "clipped_gossip", "options": options, "at": ["peer"]}
    return build_pipeline(AggregationConfig(stages=[stage]), sites.PEER).reduce(updates)


def _by_hand(rows: dict[str, torch.Tensor], weights: torch.Tensor, tau: float | None, delta: float):
    """x_i + sum_j w_ij clip(x_j - x_i, tau_i), one peer at a time, in float64."""
    flat = torch.cat([rows[k].reshape(N, -1) for k in ("w", "b")], dim=1).double()
    out = []
    for i in range(N):
        js = [j for j in range(N) if weights[i, j] > 0]
        gaps = [flat[j] - flat[i] for j in js]
        dist = [float(torch.linalg.vector_norm(z)) for z in gaps]
        if tau is None:  # the weighted (1 - delta)-quantile of the distances
            radius, total = 0.0, 0.0
            for d, j in sorted(zip(dist, js, strict=True)):
                total += float(weights[i, j])
                radius = d
                if total >= 1 - delta - 1e-12:
                    break
        else:
            radius = tau
        move = sum(
            float(weights[i, j]) * min(1.0, radius / max(d, 1e-300)) * z
            for j, d, z in zip(js, dist, gaps, strict=True)
        )
        out.append(flat[i] + move)
    return torch.stack(out)


@pytest.mark.parametrize(("tau", "delta"), [(1.5, 0.2), (None, 0.2), (None, 0.4)])
def test_clipped_gossip_equals_a_per_peer_loop(tau, delta):
    updates, rows, weights = _peer_updates()
    options = {"delta": delta} if tau is None else {"tau": tau}
    mixed = _reduce(updates, **options)
    got = torch.cat([mixed[k].reshape(N, -1) for k in ("w", "b")], dim=1).double()
    torch.testing.assert_close(got, _by_hand(rows, weights, tau, delta), atol=1e-6, rtol=0)


def test_an_infinite_radius_is_plain_gossip_mixing():
    updates, rows, weights = _peer_updates(1)
    mixed = _reduce(updates, tau=float("inf"))
    plain = build_pipeline(AggregationConfig(), sites.PEER).reduce(updates)
    for k in rows:
        torch.testing.assert_close(mixed[k], plain[k], atol=1e-6, rtol=0)
        torch.testing.assert_close(mixed[k], torch.einsum("ij,j...->i...", weights, rows[k]))


def test_the_outlier_is_clipped_and_reported():
    updates, _, weights = _peer_updates()
    pipeline = build_pipeline(
        AggregationConfig(stages=[{"name": "clipped_gossip", "options": {"tau": 1.0}, "at": ["peer"]}]),
        sites.PEER,
    )
    pipeline.reduce(updates)
    reports = pipeline.reducer.reports  # type: ignore[attr-defined]
    assert [r.output for r in reports] == list(range(N))
    for r in reports:
        kept = dict(zip(r.rows, r.kept, strict=True))
        assert kept[r.output] == 1.0  # its own row, at distance 0
        if r.output != 3 and 3 in kept:
            assert kept[3] < 0.1  # the far row moves the receiver by at most w tau


def test_clipped_gossip_is_refused_away_from_peers_and_with_bad_options():
    with pytest.raises(ConfigError) as error:
        build_pipeline(AggregationConfig(stages=["clipped_gossip"]), sites.SERVER)
    assert error.value.key == "aggregation.stages.0.at"
    for option, value in (("tau", -1.0), ("tau", "sometimes"), ("delta", 1.0)):
        with pytest.raises(ConfigError) as error:
            stage = {"name": "clipped_gossip", "options": {option: value}, "at": ["peer"]}
            build_pipeline(AggregationConfig(stages=[stage]), sites.PEER)
        assert error.value.key == f"aggregation.stages.0.options.{option}"


def test_sent_rows_are_poisoned_from_the_model_they_were_trained_from():
    config = AdversaryConfig(clients=[1, 3], attack="sign_flip", options={"scale": 2.0})
    adversary = PeerAdversary(Adversary(config, np.array([1, 3]), 0), 4)
    start = {"w": torch.arange(8.0).reshape(4, 2), "n": torch.tensor([1, 1, 1, 1])}
    sent = {
        "w": start["w"] + torch.tensor([[1.0, 0.0], [0.5, -1.0], [2.0, 2.0], [0.0, 3.0]]),
        "n": start["n"],
    }
    out = adversary.sent(1, sent, start, torch.arange(4))
    change = sent["w"] - start["w"]
    assert torch.equal(out["w"][[0, 2]], sent["w"][[0, 2]])  # honest senders as trained
    torch.testing.assert_close(out["w"][[1, 3]], (start["w"] - 2.0 * change)[[1, 3]])
    assert adversary.honest.tolist() == [True, False, True, False]


def _digits(tmp_path: Path, algorithm: dict, adversary: dict | None, stages: list, executor: str = "batched"):
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": 3,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {**algorithm, "optimizer": {"lr": 0.1}},
        "aggregation": {"stages": stages},
        "engine": {"executor": executor, "threads": 1},
        "output": {"dir": str(tmp_path / executor), "plots": False},
    }
    if adversary is not None:
        config["adversary"] = adversary
    return fedge.run(config)


FLIP = {"clients": [2, 7], "attack": "sign_flip", "options": {"scale": 4.0}}
CLIPPED = [{"name": "clipped_gossip", "at": ["peer"]}]


def test_sign_flipping_peers_hurt_gossip_and_not_clipped_gossip(tmp_path):
    gossip = {"name": "gossip"}
    clean = _digits(tmp_path, gossip, None, []).summary["final_accuracy"]
    attacked = _digits(tmp_path, gossip, FLIP, [])
    defended = _digits(tmp_path, gossip, FLIP, CLIPPED)
    assert attacked.summary["final_accuracy"] < clean - 0.2
    assert defended.summary["final_accuracy"] > attacked.summary["final_accuracy"] + 0.2
    row = attacked.metrics[-1]
    assert row["malicious"] == 2 and row["malicious_selected"] == pytest.approx(2 / 9)
    assert row["malicious_kept"] == pytest.approx(0.2)  # uniform weights over 10, own included
    assert defended.summary["malicious_kept"] < 0.1 and attacked.summary["malicious"] == 6
    assert "accuracy_all" in row and row["accuracy"] != row["accuracy_all"]


def test_afind_takes_in_fewer_poisoners_when_they_poison_their_probes(tmp_path):
    afind = {"name": "afind"}
    honest = _digits(tmp_path, afind, FLIP, []).summary
    naive = _digits(tmp_path, afind, {**FLIP, "probes": "poisoned"}, []).summary
    assert naive["malicious_selected"] < honest["malicious_selected"]
    assert naive["final_accuracy"] > honest["final_accuracy"]


def test_executors_agree_under_malicious_peers(tmp_path):
    runs = [_digits(tmp_path, {"name": "gossip"}, FLIP, CLIPPED, e) for e in ("batched", "sequential")]
    states = [final_state(r.run_dir) for r in runs]
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k], atol=1e-5, rtol=1e-5)
    assert runs[0].summary["malicious_kept"] == pytest.approx(runs[1].summary["malicious_kept"], abs=1e-6)


def test_fedfomo_scores_poisoners_as_sent_and_dispfl_poisons_kept_values(tmp_path):
    fomo, dispfl = {"name": "fedfomo"}, {"name": "dispfl"}
    clean = _digits(tmp_path / "fc", fomo, None, [])
    attacked = _digits(tmp_path / "fa", fomo, FLIP, [])
    assert attacked.summary["final_accuracy"] != clean.summary["final_accuracy"]
    assert attacked.summary["malicious"] == 6 and attacked.summary["malicious_kept"] < 0.05
    sparse = _digits(tmp_path / "dc", dispfl, None, []).summary["final_accuracy"]
    hit = _digits(tmp_path / "da", dispfl, FLIP, [])
    assert hit.summary["final_accuracy"] < sparse - 0.2
    assert hit.metrics[-1]["malicious_kept"] == pytest.approx(0.2)  # a coordinate's holders, on average


@pytest.mark.parametrize("algorithm", ["fedfomo", "dispfl"])
def test_executors_agree_under_malicious_fomo_and_dispfl_peers(tmp_path, algorithm):
    runs = [_digits(tmp_path, {"name": algorithm}, FLIP, [], e) for e in ("batched", "sequential")]
    states = [final_state(r.run_dir) for r in runs]
    for k in states[0]:
        torch.testing.assert_close(states[0][k], states[1][k], atol=1e-5, rtol=1e-5)
    assert runs[0].summary["malicious_kept"] == pytest.approx(runs[1].summary["malicious_kept"], abs=1e-6)


@pytest.mark.parametrize("algorithm", ["gossip", "pens", "federico", "local", "fedfomo", "dispfl"])
def test_an_adversary_that_never_attacks_changes_no_number(tmp_path, algorithm):
    plain = tiny(algorithm, tmp_path / "plain")
    idle = {**tiny(algorithm, tmp_path / "idle"), "adversary": {**FLIP, "clients": [1], "start_round": 9}}
    runs = [fedge.run(plain), fedge.run(idle)]
    for k, v in final_state(runs[0].run_dir).items():
        assert torch.equal(v, final_state(runs[1].run_dir)[k])
    assert runs[1].metrics[-1]["accuracy_all"] == runs[0].metrics[-1]["accuracy"]
    assert runs[1].metrics[-1]["malicious"] == 0


@pytest.mark.parametrize("algorithm", ["gossip", "fedfomo", "dispfl"])
def test_label_flipping_peers_train_on_flipped_labels(tmp_path, algorithm):
    clean = fedge.run(tiny(algorithm, tmp_path / "clean"))
    config = {**tiny(algorithm, tmp_path / "flip"), "adversary": {"clients": [1], "attack": "label_flip"}}
    flipped = fedge.run(config)
    assert flipped.metrics[0]["train_loss"] != clean.metrics[0]["train_loss"]
    assert flipped.metrics[-1]["malicious"] == 1
    if algorithm == "gossip":
        assert flipped.metrics[-1]["malicious_selected"] > 0


@pytest.mark.parametrize(
    ("algorithm", "adversary", "key"),
    [
        ("gossip", {**FLIP, "probes": "poisoned"}, "adversary.probes"),
        ("fedfomo", {**FLIP, "probes": "poisoned"}, "adversary.probes"),
        ("dispfl", {**FLIP, "attack": "alie", "options": {}}, "adversary.attack"),
    ],
)
def test_refusals_name_the_key(tmp_path, algorithm, adversary, key):
    with pytest.raises(ConfigError) as error:
        parse_config({**tiny(algorithm, tmp_path), "adversary": adversary})
    assert error.value.key == key
