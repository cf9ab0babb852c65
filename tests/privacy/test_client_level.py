"""Client-level DP-FedAvg in whole runs: exact FedAvg at clip 1e9 and noise 0, both executors alike
with seeded noise, Poisson participation (its expected count, its releases, rounds nobody is drawn in),
privacy.target_epsilon's calibration, an edge-noised hierarchy, the planner's refusals and a resume of
an adaptive clip."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cases import tiny

import fedge
from fedge.config import parse_config
from fedge.errors import ConfigError
from fedge.privacy.client_level import plan_client_level
from fedge.runtime.star import poisson_clients

SKIP = {"wall_seconds"}


def dp(tmp_path: Path, rounds: int = 2, clip: dict[str, Any] | None = None, **gaussian: Any) -> dict:
    config = tiny("fedavg", tmp_path, rounds)
    config["aggregation"] = {
        "stages": [
            {"name": "clip", "options": clip or {"clip": 1.0}},
            {"name": "gaussian", "options": gaussian},
        ]
    }
    return config


def rows(result) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in row.items() if k not in SKIP and not k.startswith("epsilon")}
        for row in result.metrics
    ]


def releases(result) -> list[dict[str, str]]:
    with open(result.run_dir / "privacy.csv") as f:
        return list(csv.DictReader(f))


def test_clip_1e9_and_no_noise_give_fedavgs_numbers_with_matching_weights(tmp_path):
    plain = fedge.run(tiny("fedavg", tmp_path / "plain"))  # iid: equal sizes, sample weights are uniform
    private = fedge.run(dp(tmp_path / "dp", clip={"clip": 1e9}, noise_multiplier=0.0))
    assert rows(private) == rows(plain)
    uneven = tiny("fedavg", tmp_path / "uneven")
    uneven["partition"] = {"kind": "dirichlet", "alpha": 0.5, "num_clients": 4}
    plain_uneven = fedge.run(uneven)

    def staged(name: str, *stages: dict[str, Any]) -> list[dict[str, Any]]:
        config = {**uneven, "aggregation": {"stages": list(stages)}}
        config["output"] = {**uneven["output"], "dir": str(tmp_path / name)}
        return rows(fedge.run(config))

    clip_only = {"name": "clip", "options": {"clip": 1e9}}  # keeps the sample weights
    assert staged("weighted", clip_only) == rows(plain_uneven)
    uniform = {"name": "clip", "options": {"clip": 1e9, "weights": "uniform"}}
    noiseless = {"name": "gaussian", "options": {"noise_multiplier": 0.0}}
    equal = staged("uniform", uniform)
    assert staged("dp-uneven", uniform, noiseless) == equal != rows(plain_uneven)


def test_both_executors_add_the_same_seeded_noise(tmp_path):
    results = []
    for executor in ("sequential", "batched"):
        config = dp(tmp_path / executor, noise_multiplier=1.0)
        config["engine"] = {"executor": executor}
        results.append(fedge.run(config))
    for a, b in zip(*(r.metrics for r in results), strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["epsilon"] == b["epsilon"]
    noiseless = fedge.run(dp(tmp_path / "none", noise_multiplier=0.0))
    assert results[0].metrics[-1]["loss"] != noiseless.metrics[-1]["loss"]


def test_poisson_draws_fraction_n_on_average_and_is_recorded_as_poisson(tmp_path):
    counts = [len(poisson_clients(3, t, 50, 0.2)) for t in range(1, 2001)]
    assert np.mean(counts) == pytest.approx(10.0, rel=0.03)
    assert min(counts) < 10 < max(counts)
    config = dp(tmp_path, rounds=3, noise_multiplier=1.0)
    config["algorithm"]["fraction"] = 0.5
    config["privacy"] = {"participation": "poisson"}
    result = fedge.run(config)
    drawn = [len(poisson_clients(3, t, 4, 0.5)) for t in (1, 2, 3)]
    assert [row["participants"] for row in result.metrics] == drawn
    recorded = releases(result)
    assert {(r["kind"], r["sampling"], r["probability"]) for r in recorded} == {("update", "poisson", "0.5")}


def test_a_round_nobody_is_drawn_in_leaves_the_model_as_it_was(tmp_path):
    config = tiny("fedavg", tmp_path, 4)
    config["algorithm"]["fraction"] = 0.05
    config["privacy"] = {"participation": "poisson"}
    drawn = [len(poisson_clients(3, t, 4, 0.05)) for t in range(1, 5)]
    assert 0 in drawn  # the seed and fraction give at least one empty round
    metrics = fedge.run(config).metrics
    for t, count in enumerate(drawn):
        assert metrics[t]["participants"] == count
        if count == 0 and t > 0:
            assert metrics[t]["accuracy"] == metrics[t - 1]["accuracy"]


def test_target_epsilon_calibrates_the_gaussian_stage(tmp_path):
    config = dp(tmp_path, rounds=3)
    config["privacy"] = {"target_epsilon": 3.0}
    result = fedge.run(config)
    assert result.summary["epsilon"] == pytest.approx(3.0, rel=1e-3)
    assert result.summary["epsilon"] <= 3.0 * (1 + 1e-9)


def test_target_epsilon_calibrates_gaussian_shares_summed_by_secagg_as_the_distributed_gaussian(tmp_path):
    def run(name: str, *stages: Any) -> fedge.Result:
        config = tiny("fedavg", tmp_path / name, 3)
        config["aggregation"] = {"stages": [{"name": "clip", "options": {"clip": 1.0, "weights": "uniform"}}]}
        config["aggregation"]["stages"] += list(stages)
        config["privacy"] = {"target_epsilon": 3.0}
        return fedge.run(config)

    secure = run("secagg", "gaussian_share", "secagg")
    assert secure.summary["aggregation"] == {"server": ["clip", "gaussian_share", "secagg"]}
    assert secure.summary["epsilon"] == pytest.approx(3.0, rel=1e-3)
    recorded = releases(secure)
    assert [(r["round"], r["kind"]) for r in recorded] == [("1", "update"), ("2", "update"), ("3", "update")]
    distributed = run("gaussian", {"name": "gaussian", "options": {"mode": "distributed"}})
    assert secure.summary["epsilon"] == distributed.summary["epsilon"]
    assert recorded == releases(distributed)  # the same calibrated multiplier, the same releases
    for a, b in zip(secure.metrics, distributed.metrics, strict=True):  # the same shares, summed securely
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
    shares = ["clip", {"name": "gaussian_share", "options": {"noise_multiplier": 2.0}}, "secagg"]
    star = {**tiny("fedavg", tmp_path), "aggregation": {"stages": shares}}
    planned = plan_client_level(parse_config(star), [60] * 4, 1.0)
    assert [(r.round, r.kind, r.noise_multiplier) for r in planned] == [
        (1, "update", 2.0),
        (2, "update", 2.0),
    ]
    cells = tiny("hfedavg", tmp_path)
    cells["algorithm"]["cells"] = 2
    at_edge = [{"name": s, "at": ["edge"]} if isinstance(s, str) else {**s, "at": ["edge"]} for s in shares]
    cells["aggregation"] = {"stages": at_edge}
    planned = plan_client_level(parse_config(cells), [60] * 4, 1.0)
    assert [(r.kind, r.clients) for r in planned] == [("edge", (0, 1)), ("edge", (2, 3))] * 2


def test_gaussian_shares_no_reducer_accounts_are_refused_before_the_run(tmp_path):
    config = tiny("fedavg", tmp_path)
    config["aggregation"] = {
        "stages": ["clip", {"name": "gaussian_share", "options": {"noise_multiplier": 1.0}}]
    }
    with pytest.raises(
        ConfigError, match=r"^aggregation\.stages\.1: gaussian_share at the server: its noise"
    ):
        fedge.run(config)
    assert not any(tmp_path.rglob("metrics.jsonl"))


def test_edge_noise_in_a_hierarchy_spends_each_cells_members(tmp_path):
    config = tiny("hfedavg", tmp_path, 2)
    config["algorithm"].update(cells=2, edge_rounds=2)
    stages = [
        {"name": "clip", "options": {"clip": 1.0}},
        {"name": "gaussian", "options": {"noise_multiplier": 1.0}},
    ]
    config["aggregation"] = {"stages": [dict(s, at=["edge"]) for s in stages]}
    result = fedge.run(config)
    recorded = releases(result)
    assert len(recorded) == 2 * 2 * 2  # rounds x edge rounds x cells
    assert {r["kind"] for r in recorded} == {"edge"} and {r["clients"] for r in recorded} == {"0 1", "2 3"}
    assert 0 < result.summary["epsilon"] < float("inf")
    planned = plan_client_level(parse_config(config), [60] * 4, 1.0)
    assert sum(r.count for r in planned) == len(recorded)
    config["aggregation"] = {"stages": stages}  # at every site: the cloud cannot be accounted
    config["output"] = {**config["output"], "dir": str(tmp_path / "cloud")}
    with pytest.raises(
        ConfigError, match=r"aggregation\.stages\.1: gaussian cannot be accounted at the cloud"
    ):
        fedge.run(config)
    assert not (tmp_path / "cloud").exists() or not any((tmp_path / "cloud").rglob("metrics.jsonl"))


def test_the_planner_refuses_algorithms_it_cannot_account(tmp_path):
    config = tiny("splitfed_v2", tmp_path)
    config["aggregation"] = {"stages": ["clip", {"name": "gaussian", "options": {"noise_multiplier": 1.0}}]}
    with pytest.raises(ConfigError, match=r"aggregation\.stages\.1"):
        plan_client_level(parse_config(config), [60] * 4, 1.0)
    config = tiny("splitfed_v2", tmp_path)
    config["privacy"] = {"participation": "poisson"}
    with pytest.raises(ConfigError, match=r"privacy\.participation"):
        plan_client_level(parse_config(config), [60] * 4, 1.0)


def test_a_resumed_adaptive_clip_gives_the_same_numbers(tmp_path):
    clip = {"clip": 0.05, "adaptive": True, "count_noise_multiplier": 2.0}
    whole = fedge.run(dp(tmp_path / "whole", rounds=3, clip=clip, noise_multiplier=0.5))
    config = dp(tmp_path / "cut", rounds=3, clip=clip, noise_multiplier=0.5)
    config["rounds"] = 2
    first = fedge.run(config)
    resumed = fedge.resume(first.run_dir, rounds=3)
    assert rows(resumed) == rows(whole)
    assert resumed.summary["epsilon"] == pytest.approx(whole.summary["epsilon"])


def test_max_epsilon_stops_before_the_planned_budget_is_crossed(tmp_path):
    config = dp(tmp_path, rounds=10, noise_multiplier=1.5)
    per_round = fedge.run(dp(tmp_path / "one", rounds=1, noise_multiplier=1.5)).summary["epsilon"]
    config["stop"] = {"max_epsilon": 2.5 * per_round}  # composition spends less than linearly: 3+ rounds fit
    result = fedge.run(config)
    assert result.summary["stopped_by"] == "max_epsilon" and 3 <= result.summary["rounds"] < 10
    assert result.summary["epsilon"] <= 2.5 * per_round
    config["stop"] = {"max_epsilon": per_round / 2}
    config["output"] = {**config["output"], "dir": str(tmp_path / "refused")}
    with pytest.raises(ConfigError, match=r"stop\.max_epsilon"):
        fedge.run(config)


@pytest.mark.parametrize("form", ["compact", "masked"])
def test_hist_edge_noise_stays_off_the_slots_a_cell_does_not_train(tmp_path, monkeypatch, form):
    """A HIST cell's model keeps zeros outside its submodel after a noisy edge aggregation: noise there
    would come back as each client's change at the next edge round (clients train and send zeros on
    those slots) and the clip would spend its bound on it."""
    from fedge.algorithms.hierarchical.hierarchy import HierarchicalFL
    from fedge.algorithms.hierarchical.submodel import apply_valid

    seen = []
    edge_round = HierarchicalFL._edge_round

    def recorded(self, rnd, e, views, cell_params, cell_buffers):
        out = edge_round(self, rnd, e, views, cell_params, cell_buffers)
        seen.append((views, out[0]))
        return out

    monkeypatch.setattr(HierarchicalFL, "_edge_round", recorded)
    config = tiny("hist", tmp_path, 1)
    config["model"] = {"name": "fcnn"}
    config["algorithm"].update(cells=2, edge_rounds=2, form=form)
    stages = [
        {"name": "clip", "options": {"clip": 1.0}},
        {"name": "gaussian", "options": {"noise_multiplier": 5.0}},
    ]
    config["aggregation"] = {"stages": [dict(s, at=["edge"]) for s in stages]}
    fedge.run(config)
    assert len(seen) == 2 and seen[0][0].layout
    for views, params in seen:
        masked = apply_valid(params, views.layout, list(views.valid))
        assert all(torch.equal(masked[k], params[k]) for k in params)
