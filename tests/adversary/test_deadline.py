"""Malicious clients of ``fedavg_deadline``: the rows the server received by the deadline (a client cut
short that still sends included) are poisoned before its pipeline, as at the star server, with
``scaling``'s ``n / m`` over the received rows; a sign flip ruins the mean and the median holds; a
backdoor reports ``attack_success``; both executors agree, a run resumes to the same numbers, and a run
whose attackers never start is unchanged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import fedge

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cases import killed_after, reduced, tiny  # noqa: E402

SLOW = {"devices": {"cpu_hz": [[1e9, 1e9], [1e6, 1e6]]}}  # the slow half fit part of their steps in 0.13 s


def _config(tmp_path: Path, adversary: dict | None, late: str = "partial", rounds: int = 3) -> dict[str, Any]:
    config = tiny("fedavg_deadline", tmp_path / "runs", rounds=rounds)
    config["partition"]["num_clients"] = 6
    config["algorithm"].update(fraction=1.0, deadline_s=0.13, late=late)
    config["system"] = SLOW
    if adversary is not None:
        config["adversary"] = adversary
    return config


def _numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    drop = ("wall_seconds", "malicious", "malicious_kept")
    return [{k: v for k, v in r.items() if k not in drop} for r in rows]


def test_the_received_rows_carry_the_attack_partial_senders_included(tmp_path, monkeypatch):
    honest, plain = reduced(monkeypatch, _config(tmp_path, None))
    adversary = {"clients": [0, 1, 2, 3], "attack": "sign_flip", "options": {"scale": 2.0}}
    attacked, result = reduced(monkeypatch, _config(tmp_path, adversary))
    assert [r["partial"] for r in plain.metrics] == [r["partial"] for r in result.metrics]
    assert all(r["partial"] for r in result.metrics) and all(r["late"] == 0 for r in result.metrics)
    h, a, ref = honest[0].parts[0], attacked[0].parts[0], attacked[0].reference  # round 1: same training
    flipped = []
    for i in range(len(a.weights)):
        same = all(torch.allclose(a.rows[k][i], h.rows[k][i], atol=1e-6) for k in a.rows)
        flip = all(
            torch.allclose(a.rows[k][i], ref[k] - 2.0 * (h.rows[k][i] - ref[k]), atol=1e-6) for k in a.rows
        )
        assert same != flip
        flipped.append(flip)
    assert sum(flipped) == result.metrics[0]["malicious"] == 4
    weights = a.weights.cpu()
    assert any(f and w < weights.max() - 1e-9 for f, w in zip(flipped, weights.tolist(), strict=True))


def test_scalings_boost_is_the_received_rows_over_the_malicious_ones(tmp_path, monkeypatch):
    honest, _ = reduced(monkeypatch, _config(tmp_path, None, late="drop"))
    adversary = {"clients": [0, 3, 4], "attack": "scaling"}  # 3 and 4 miss the deadline
    attacked, result = reduced(monkeypatch, _config(tmp_path, adversary, late="drop"))
    row = result.metrics[0]
    n, m = row["participants"], row["malicious"]
    assert row["late"] > 0 and len(attacked[0].parts[0].weights) == n and 0 < m < n
    h, a = honest[0].parts[0], attacked[0].parts[0]
    ref, boosted = attacked[0].reference, 0
    for i in range(n):  # n / m over the received rows (the dropped ones are not the round's)
        same = all(torch.allclose(a.rows[k][i], h.rows[k][i], atol=1e-6) for k in a.rows)
        boosted += not same
        if not same:
            for k in a.rows:
                assert torch.allclose(a.rows[k][i], ref[k] + n / m * (h.rows[k][i] - ref[k]), atol=1e-5)
    assert boosted == m


def _digits(tmp_path: Path, stages: list[Any], adversary: dict | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": 5,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 10},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": "fedavg_deadline", "optimizer": {"lr": 0.1}, "deadline_s": 0.13},
        "system": SLOW,
        "aggregation": {"stages": stages},
        "output": {"dir": str(tmp_path), "plots": False},
    }
    if adversary is not None:
        config["adversary"] = adversary
    return config


def test_a_sign_flip_ruins_the_mean_and_the_median_holds(tmp_path):
    adversary = {"clients": [0, 1], "attack": "sign_flip", "options": {"scale": 2.0}}
    clean = fedge.run(_digits(tmp_path, [], None)).summary
    mean = fedge.run(_digits(tmp_path, [], adversary)).summary
    median = fedge.run(_digits(tmp_path, [{"name": "median"}], adversary)).summary
    assert mean["final_accuracy"] < clean["final_accuracy"] - 0.3
    assert median["final_accuracy"] > mean["final_accuracy"] + 0.3
    assert median["malicious_kept"] < mean["malicious_kept"] == pytest.approx(0.4)  # 2 of the 5 in time


def test_the_backdoor_reports_its_success(tmp_path):
    backdoor = {"clients": [0, 1, 2], "attack": "backdoor", "options": {"target": 0}}
    attacked = fedge.run(_digits(tmp_path, [], backdoor))
    clean = fedge.run(_digits(tmp_path, [], {**backdoor, "start_round": 99}))
    assert all("attack_success" in r for r in attacked.metrics)
    assert attacked.metrics[-1]["attack_success"] > clean.metrics[-1]["attack_success"] + 0.2


@pytest.mark.parametrize("attack", ["gaussian", "alie", "label_flip"])
def test_both_executors_poison_alike(tmp_path, monkeypatch, attack):
    runs = []
    for executor in ("sequential", "batched"):
        config = _config(tmp_path, {"clients": 0.5, "attack": attack})
        config["engine"] = {"executor": executor}
        runs.append(reduced(monkeypatch, config))
    (seq, first), (bat, second) = runs
    for a, b in zip(seq, bat, strict=True):
        for name, rows in a.parts[0].rows.items():
            assert torch.allclose(rows.double(), b.parts[0].rows[name].double(), atol=1e-5)
    assert [m["malicious"] for m in first.metrics] == [m["malicious"] for m in second.metrics]
    assert first.metrics[-1]["accuracy"] == pytest.approx(second.metrics[-1]["accuracy"], abs=1e-6)


def test_an_attacked_run_resumes_to_the_same_numbers(tmp_path):
    adversary = {"clients": [2, 5], "attack": "gaussian"}
    whole = fedge.run(_config(tmp_path / "whole", adversary, rounds=4))
    config = _config(tmp_path / "cut", adversary, rounds=4)
    config["output"]["name"] = "cut"
    killed_after(config, 2)
    resumed = fedge.resume(tmp_path / "cut" / "runs" / "cut")
    assert _numbers(resumed.metrics) == _numbers(whole.metrics)
    assert [r["malicious"] for r in resumed.metrics] == [r["malicious"] for r in whole.metrics]


def test_attackers_that_never_start_change_no_number(tmp_path):
    plain = fedge.run(_config(tmp_path, None))
    late = fedge.run(_config(tmp_path, {"clients": [0, 5], "attack": "label_flip", "start_round": 9}))
    assert "malicious" not in plain.metrics[-1] and "malicious" not in plain.summary
    assert _numbers(plain.metrics) == _numbers(late.metrics)
    assert late.summary["malicious"] == 0
