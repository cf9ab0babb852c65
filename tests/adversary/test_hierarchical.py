"""Malicious members of a hierarchy's cells (fedge.runtime.cell_adversary): each cell's attacking uploads
equal a hand computation from the edge's broadcast and the cell's honest rows, HIST's poisoned rows stay
zero outside the cell's slots, sign flipping breaks HFedAvg's mean and a median at the edge recovers it,
``malicious_kept`` reads the edges' reducers, both executors agree, a run whose attackers never start
is unchanged, and bad configs are refused naming the key."""

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
from cases import reduced, tiny  # noqa: E402


def _config(tmp_path: Path, algorithm: str, adversary: dict | None, clients: int = 8, cells: int = 2,
            **options: Any) -> dict[str, Any]:  # fmt: skip
    config = tiny(algorithm, tmp_path / "runs")
    config["partition"]["num_clients"] = clients
    config["algorithm"].update(cells=cells, **options)
    if adversary is not None:
        config["adversary"] = adversary
    return config


def _floating(updates: Updates) -> dict[str, torch.Tensor]:
    return {k: v for k, v in updates.parts[0].rows.items() if v.is_floating_point()}


@pytest.mark.parametrize("attack", ["sign_flip", "alie"])
def test_each_cells_uploads_are_poisoned_from_its_broadcast_and_honest_rows(tmp_path, monkeypatch, attack):
    honest, _ = reduced(monkeypatch, _config(tmp_path, "hfedavg", None), "edge")
    options = {"scale": 2.0} if attack == "sign_flip" else {}
    adversary = {"clients": [1, 2, 6], "attack": attack, "options": options}
    attacked, _ = reduced(monkeypatch, _config(tmp_path, "hfedavg", adversary), "edge")
    bad = {1, 2, 6}
    reference = attacked[0].reference  # the first edge round: every cell's broadcast, stacked per cell
    for name, rows in _floating(attacked[0]).items():
        trained = honest[0].parts[0].rows[name]  # the same start: the honest run's rows as trained
        for cell, members in ((0, range(4)), (1, range(4, 8))):
            ref, mine = reference[name][cell], [i for i in members if i in bad]
            others = torch.stack([trained[i] - ref for i in members if i not in bad]).double()
            for i in members:
                if i not in bad:
                    assert torch.equal(rows[i], trained[i])
                elif attack == "sign_flip":
                    assert torch.allclose(rows[i], ref - 2.0 * (trained[i] - ref), atol=1e-6)
                else:  # the cell's honest changes only: 4 members, m of them malicious
                    z = alie_z(4, len(mine))
                    want = ref + others.mean(0) - z * others.std(0, correction=1 if len(others) > 1 else 0)
                    assert torch.allclose(rows[i].double(), want, atol=1e-5)


@pytest.mark.parametrize("form", ["compact", "masked"])
def test_hist_poisons_only_the_cells_slots(tmp_path, monkeypatch, form):
    # 16 hidden neurons over 3 cells: compact cells are padded, masked ones hold foreign slots
    adversary = {"clients": [1, 5], "attack": "gaussian", "options": {"sigma": 0.5}}
    config = _config(tmp_path, "hist", adversary, clients=9, cells=3, form=form)
    attacked, result = reduced(monkeypatch, config, "edge")
    first = attacked[0]
    for name, rows in _floating(first).items():
        for client, cell in ((1, 0), (5, 1)):
            ref = first.reference[name][cell]
            outside = ref == 0  # the slots the cell does not hold (zero in its broadcast submodel)
            assert torch.equal(rows[client][outside], torch.zeros_like(rows[client][outside]))
            assert bool((rows[client][~outside] != ref[~outside]).all())  # noise on every real slot
    assert result.metrics[0]["malicious"] == 2 * config["algorithm"]["edge_rounds"]


def test_hist_forms_give_the_same_attacked_run(tmp_path):
    adversary = {"clients": [1, 5], "attack": "gaussian", "options": {"sigma": 0.1}}
    runs = [fedge.run(_config(tmp_path, "hist", adversary, 9, 3, form=f)) for f in ("compact", "masked")]
    assert runs[0].summary["final_loss"] == pytest.approx(runs[1].summary["final_loss"], rel=1e-6)


def test_malicious_kept_averages_the_edges_shares(tmp_path):
    adversary = {"clients": [1], "attack": "sign_flip", "options": {"scale": 4.0}}
    mean = fedge.run(_config(tmp_path, "hfedavg", adversary, edge_rounds=2))
    assert [m["malicious"] for m in mean.metrics] == [2, 2]  # one member, two uploads a round
    assert mean.metrics[0]["malicious_kept"] == pytest.approx(0.125)  # 1/4 in one cell of two
    assert mean.summary["malicious"] == 4 and mean.summary["malicious_kept"] == pytest.approx(0.125)
    config = _config(tmp_path, "hfedavg", adversary, edge_rounds=2)
    config["aggregation"] = {"stages": [{"name": "median", "at": ["edge"]}]}
    median = fedge.run(config)
    assert 0 <= median.summary["malicious_kept"] < 0.125
    config["aggregation"] = {"stages": [{"name": "median", "at": ["cloud"]}]}  # the edges' mean again
    assert fedge.run(config).metrics[0]["malicious_kept"] == pytest.approx(0.125)


def test_aircomp_edges_take_the_poisoned_rows(tmp_path):
    adversary = {"clients": [1], "attack": "gaussian"}
    result = fedge.run(_config(tmp_path, "hfedavg", adversary, aggregation="aircomp"))
    last = result.metrics[-1]
    assert last["malicious"] == 1 and last["malicious_kept"] == pytest.approx(0.125)  # the air's mean


def test_sign_flip_breaks_hfedavgs_mean_not_a_median_at_the_edge(tmp_path):
    def digits(stages: list[Any], attacked: bool) -> float:
        config: dict[str, Any] = {
            "seed": 1,
            "rounds": 5,
            "data": {"name": "digits"},
            "partition": {"kind": "iid", "num_clients": 12},
            "model": {"name": "mlp", "options": {"hidden": [32]}},
            "algorithm": {"name": "hfedavg", "cells": 3, "split": "partition", "edge_rounds": 2,
                          "local_steps": 5, "batch_size": 16, "optimizer": {"lr": 0.1}},
            "aggregation": {"stages": stages},
            "output": {"dir": str(tmp_path), "plots": False},
        }  # fmt: skip
        if attacked:  # one member of every cell
            config["adversary"] = {"clients": [0, 4, 8], "attack": "sign_flip", "options": {"scale": 4.0}}
        return fedge.run(config).summary["final_accuracy"]

    clean, mean = digits([], False), digits([], True)
    median = digits([{"name": "median", "at": ["edge"]}], True)
    assert mean < clean - 0.3
    assert median > mean + 0.3


@pytest.mark.parametrize(("algorithm", "attack"), [("hfedavg", "gaussian"), ("hist", "alie"),
                                                   ("hist", "label_flip")])  # fmt: skip
def test_both_executors_poison_alike(tmp_path, monkeypatch, algorithm, attack):
    adversary = {"clients": 0.25, "attack": attack}
    runs = []
    for executor in ("sequential", "batched"):
        config = _config(tmp_path, algorithm, adversary, edge_rounds=2)
        config["engine"] = {"executor": executor}
        runs.append(reduced(monkeypatch, config, "edge"))
    (seq, first), (bat, second) = runs
    for a, b in zip(seq, bat, strict=True):
        for name, rows in _floating(a).items():
            assert torch.allclose(rows.double(), b.parts[0].rows[name].double(), atol=1e-5)
    assert first.metrics[-1]["malicious"] == second.metrics[-1]["malicious"] == 2 * 2
    assert first.metrics[-1]["accuracy"] == pytest.approx(second.metrics[-1]["accuracy"], abs=1e-6)


@pytest.mark.parametrize("algorithm", ["hfedavg", "hist"])
def test_attackers_that_never_start_change_no_number(tmp_path, algorithm):
    plain = fedge.run(_config(tmp_path, algorithm, None))
    late = fedge.run(_config(tmp_path, algorithm, {"clients": [0, 5], "attack": "alie", "start_round": 9}))
    assert "malicious" not in plain.metrics[-1] and "malicious" not in plain.summary

    def numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("wall_seconds", "malicious", "malicious_kept")}
                for r in rows]  # fmt: skip

    assert numbers(plain.metrics) == numbers(late.metrics)
    assert [m["malicious"] for m in late.metrics] == [0, 0] and late.summary["malicious_kept"] is None


def test_bad_adversaries_in_cells_are_refused_naming_the_key(tmp_path):
    idle = _config(tmp_path, "hfedavg", {"clients": [8], "attack": "ipm"}, clients=9)  # 2 cells of 4
    with pytest.raises(ConfigError) as error:
        fedge.run(idle)
    assert error.value.key == "adversary.clients" and "in no cell" in str(error.value)
    for name in ("hist", "hfedavg"):
        assert parse_config({"algorithm": {"name": name}, "adversary": {"clients": 0.5, "attack": "ipm"}})
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())  # no run left
