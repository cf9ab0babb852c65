"""Peer-message DP (privacy.peer) in the decentralized family, and AFIND+'s Table 4 mechanism accounted."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from cases import tiny

import fedge
from fedge.config import PrivacyConfig, RunConfig
from fedge.privacy.peer import plan_peer, released_rows
from fedge.privacy.run import RunPrivacy


def peer_run(name: str, out: Path, **extra: Any) -> dict[str, Any]:
    """A tiny 2-round run of ``name`` on 4 clients, 2 peers each, one local epoch."""
    config = tiny(name, out)
    config["algorithm"].update(local_epochs=1, peers=2, **extra.pop("algorithm", {}))
    config.update(extra)
    return config


def releases(result: fedge.Result) -> list[dict[str, str]]:
    with open(result.run_dir / "privacy.csv") as handle:
        return list(csv.DictReader(handle))


FIELDS = ("train_loss", "accuracy")


@pytest.mark.parametrize("algorithm", ["gossip", "afind", "federico"])
def test_no_noise_and_a_huge_clip_give_the_plain_numbers(tmp_path: Path, algorithm: str) -> None:
    plain = fedge.run(peer_run(algorithm, tmp_path / "plain"))
    private = {"peer": {"clip": 1e9, "noise_multiplier": 0.0}}
    noised = fedge.run(peer_run(algorithm, tmp_path / "peer", privacy=private))
    for a, b in zip(plain.metrics, noised.metrics, strict=True):
        for key in FIELDS:  # start + (trained - start) rounds to within an ulp of trained
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    assert "epsilon" not in plain.metrics[-1]
    assert "epsilon" in noised.metrics[-1]


def test_noise_changes_the_models(tmp_path: Path) -> None:
    plain = fedge.run(peer_run("gossip", tmp_path / "plain"))
    noised = fedge.run(peer_run("gossip", tmp_path / "peer", privacy={"peer": {"noise_multiplier": 1.0}}))
    assert noised.metrics[-1]["train_loss"] != pytest.approx(plain.metrics[-1]["train_loss"], rel=1e-3)


def test_both_executors_add_the_same_noise(tmp_path: Path) -> None:
    results = []
    for executor in ("sequential", "batched"):
        config = peer_run(
            "gossip", tmp_path / executor, privacy={"peer": {"clip": 0.5, "noise_multiplier": 0.7}}
        )
        config["engine"] = {"executor": executor}
        results.append(fedge.run(config))
    for a, b in zip(*(r.metrics for r in results), strict=True):
        for key in (*FIELDS, "epsilon"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key


def test_a_message_has_noise_of_std_z_clip_and_one_draw_per_sender_and_round() -> None:
    privacy = RunPrivacy(PrivacyConfig(), num_clients=4, seed=7)
    rows, size, z, clip = 400, 64, 0.8, 2.5
    start = {"w": torch.zeros(rows, size), "b": torch.ones(rows, 2)}
    keys = [(3, sender) for sender in range(rows)]
    message = released_rows(privacy, start, {k: v.clone() for k, v in start.items()}, keys, clip, z)
    noise = torch.cat([message["w"], message["b"] - 1.0], dim=1)
    assert float(noise.std()) == pytest.approx(z * clip, rel=0.02)
    assert float(noise.mean()) == pytest.approx(0.0, abs=0.02)
    again = released_rows(privacy, start, start, keys, clip, z)  # every receiver gets the same message
    assert torch.equal(again["w"], message["w"])
    other = released_rows(privacy, start, start, [(4, sender) for sender in range(rows)], clip, z)
    assert not torch.equal(other["w"], message["w"])


def test_an_update_is_clipped_to_clip_relative_to_its_start() -> None:
    privacy = RunPrivacy(PrivacyConfig(), num_clients=2, seed=0)
    start = {"w": torch.full((2, 3), 1.0), "b": torch.zeros(2, 1)}
    trained = {"w": torch.tensor([[4.0, 5.0, 1.0], [1.0, 1.1, 1.0]]), "b": torch.tensor([[0.0], [0.2]])}
    message = released_rows(privacy, start, trained, [(1, 0), (1, 1)], 2.0, 0.0)
    first = torch.cat([message["w"][0] - 1.0, message["b"][0]])
    assert float(first.norm()) == pytest.approx(2.0)  # 5 scaled down to 2, direction kept
    assert torch.allclose(first, torch.tensor([3.0, 4.0, 0.0, 0.0]) * 0.4)
    assert torch.allclose(message["w"][1], trained["w"][1]) and torch.allclose(
        message["b"][1], trained["b"][1]
    )


def test_the_ledger_gets_one_release_per_sender_per_round(tmp_path: Path) -> None:
    result = fedge.run(peer_run("gossip", tmp_path, privacy={"peer": {"clip": 1.0, "noise_multiplier": 1.5}}))
    rows = releases(result)
    assert sorted((int(r["round"]), r["clients"]) for r in rows) == [
        (t, str(c)) for t in (1, 2) for c in range(4)
    ]
    assert {
        (r["kind"], r["unit"], float(r["noise_multiplier"]), float(r["clip"]), r["count"]) for r in rows
    } == {("peer", "client", 1.5, 1.0, "1")}
    assert result.summary["privacy"]["releases_by_kind"] == {"peer": 8}
    assert math.isfinite(result.summary["privacy"]["epsilon"])


def test_afind_literal_releases_one_message_per_requester_served(tmp_path: Path) -> None:
    config = peer_run(
        "afind",
        tmp_path,
        privacy={"peer": {"noise_multiplier": 1.0}},
        algorithm={"selection": "random", "aggregation": "uniform"},
    )
    result = fedge.run(config)
    rows = releases(result)
    assert {r["kind"] for r in rows} == {"peer"}  # random peers, uniform weights: only models travel
    for t in (1, 2):
        per_client = {int(r["clients"]): int(r["count"]) for r in rows if int(r["round"]) == t}
        # its own row plus one reply per requester that chose it: 4 clients each choosing 2 peers
        assert sum(per_client.values()) == 4 + 4 * 2
        assert all(count >= 1 for count in per_client.values()) and len(per_client) == 4


def test_unnoised_messages_make_the_run_not_dp(tmp_path: Path) -> None:
    result = fedge.run(peer_run("afind", tmp_path, privacy={"peer": {"noise_multiplier": 1.0}}))
    summary = result.summary["privacy"]
    assert math.isinf(summary["epsilon"])  # proxies and losses travel exactly
    assert math.isfinite(summary["epsilon_by_kind"]["peer"])
    assert math.isinf(summary["epsilon_by_kind"]["proxy"]) and math.isinf(summary["epsilon_by_kind"]["loss"])


def test_table4_proxy_mechanism_is_accounted_per_probe(tmp_path: Path) -> None:
    config = peer_run(
        "afind", tmp_path, algorithm={"dp": {"sigma": 2.0, "clip": 0.5}, "aggregation": "uniform"}
    )
    rows = releases(fedge.run(config))
    proxies = [r for r in rows if r["kind"] == "afind_proxy"]
    assert {(r["unit"], float(r["noise_multiplier"]), float(r["clip"])) for r in proxies} == {
        ("sample", 2.0, 0.5)
    }
    # every client probes each of its 3 neighbours every round: each holder answers 3 requesters
    assert sorted(int(r["count"]) for r in proxies) == [3] * 8
    assert {r["kind"] for r in rows} == {"afind_proxy", "peer_model", "model_request"}


def test_table4_update_mechanism_has_multiplier_sigma_over_the_batch(tmp_path: Path) -> None:
    config = peer_run(
        "afind",
        tmp_path,
        algorithm={"dp": {"sigma": 4.0, "clip": 1.0, "target": "update"}, "neighbor_mode": "standard"},
    )
    rows = releases(fedge.run(config))
    updates = [r for r in rows if r["kind"] == "afind_update"]
    assert updates and {float(r["noise_multiplier"]) for r in updates} == {4.0 / 32}
    assert all(r["count"] == "1" for r in updates)  # standard mode: one noisy row per sender
    assert "peer_model" not in {r["kind"] for r in rows}


def test_plan_peer() -> None:
    config = RunConfig.model_validate(
        {"rounds": 3, "algorithm": {"name": "gossip"}, "privacy": {"peer": {"clip": 2.0}}}
    )
    planned = plan_peer(config, [10, 20, 30], 1.3)
    assert len(planned) == 9 and {(r.noise_multiplier, r.clip, r.count) for r in planned} == {(1.3, 2.0, 1)}
    assert sorted({r.clients for r in planned}) == [(0,), (1,), (2,)]
    literal = RunConfig.model_validate(
        {"rounds": 1, "algorithm": {"name": "afind"}, "privacy": {"peer": {"clip": 2.0}}}
    )
    assert {r.count for r in plan_peer(literal, [10, 20, 30], 1.3)} == {3}
    fixed = config.model_copy(
        update={"privacy": PrivacyConfig.model_validate({"peer": {"noise_multiplier": 1}})}
    )
    assert {r.noise_multiplier for r in plan_peer(fixed, [10, 20, 30], 1.3)} == {1.0}
    assert plan_peer(RunConfig.model_validate({"algorithm": {"name": "gossip"}}), [1, 2], 1.0) == []
