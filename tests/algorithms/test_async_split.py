"""Asynchronous CSE-FSL (``cse_fsl_async``): what it must equal, staleness on a heterogeneous fleet, both
executors, kill-and-resume with uploads in flight, and its one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from async_cases import HETEROGENEOUS, IDENTICAL, interrupted_and_resumed, rows
from cases import tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.errors import ConfigError
from fedge.files import results
from fedge.runner.checkpoint import load


def config(tmp_path: Path, algorithm: str, name: str, rounds: int = 4, **knobs) -> dict:
    cfg = tiny(algorithm, tmp_path, rounds=rounds)
    cfg["partition"]["num_clients"] = 6
    cfg["algorithm"].update(h=2, batch_size=8, **knobs)
    cfg["output"]["name"] = name
    cfg["engine"] = {"threads": 1}
    return cfg


def state(result: fedge.Result) -> dict:
    return load(result.run_dir / results.CHECKPOINT).state["algorithm"]


def assert_same_models(a: dict, b: dict) -> None:
    for part in ("params", "buffers"):
        for name, value in a["client"][part].items():
            assert torch.equal(value, b["client"][part][name]), name
    for name, value in a["server"]["params"].items():
        assert torch.equal(value, b["server"]["params"][name]), name


@parametrize_first_by_default("executor", ["batched", "sequential"])
def test_async_cse_fsl_with_equal_arrival_times_is_cse_fsl_in_arrival_order(tmp_path, executor):
    runs = {}
    for algorithm in ("cse_fsl", "cse_fsl_async"):
        cfg = config(tmp_path, algorithm, f"{algorithm}-{executor}", server_order="arrival")
        cfg["system"] = IDENTICAL
        cfg["engine"]["executor"] = executor
        runs[algorithm] = fedge.run(cfg)
    sync, deferred = runs["cse_fsl"], runs["cse_fsl_async"]
    assert_same_models(state(sync), state(deferred))  # exactly: client and server models
    for a, b in zip(sync.metrics, deferred.metrics, strict=True):
        for key in ("accuracy", "loss", "train_loss", "sim_seconds", "mb_total", "uploads", "participants"):
            assert a[key] == b[key], key
        assert b["staleness_max"] == 0 and b["model_staleness_max"] == 0 and b["in_flight"] == 0
        assert b["server_loss"] == pytest.approx(a["server_loss"], rel=1e-6)  # summed in another order
    ledger = (sync.run_dir / "ledger.csv").read_bytes()
    assert ledger == (deferred.run_dir / "ledger.csv").read_bytes()


@pytest.mark.ci
def test_on_a_heterogeneous_fleet_uploads_are_stale_and_both_executors_agree(tmp_path):
    runs = {}
    for executor in ("batched", "sequential"):
        cfg = config(tmp_path, "cse_fsl_async", f"async-{executor}", rounds=6, buffer_size=2)
        cfg["algorithm"].update(participation="without_replacement", clients_per_round=4)
        cfg["system"] = HETEROGENEOUS
        cfg["engine"]["executor"] = executor
        runs[executor] = fedge.run(cfg)
    batched, sequential = runs["batched"], runs["sequential"]
    assert max(row["staleness_max"] for row in batched.metrics) > 0
    assert max(row["model_staleness_max"] for row in batched.metrics) > 0
    assert all(row["participants"] == 2 for row in batched.metrics)
    times = [row["sim_seconds"] for row in batched.metrics]
    assert times == sorted(times) and times[0] > 0
    assert [row["sim_seconds"] for row in sequential.metrics] == times  # the same events in the same order
    assert [row["uploads"] for row in sequential.metrics] == [row["uploads"] for row in batched.metrics]
    for name, value in state(batched)["client"]["params"].items():
        torch.testing.assert_close(state(sequential)["client"]["params"][name], value, atol=1e-5, rtol=1e-5)
    again = fedge.run({**cfg, "output": {**cfg["output"], "name": "async-again"}})
    assert rows(again) == rows(sequential)  # same seed, same events


def test_an_interrupted_async_cse_fsl_run_resumes_bit_identically(tmp_path):
    cfg = config(tmp_path / "ref", "cse_fsl_async", "run", rounds=8, buffer_size=2)
    cfg["system"] = HETEROGENEOUS
    cfg["output"]["checkpoint_every"] = 3
    # after round 5; the last checkpoint is round 3's, with uploads and models in flight
    reference, saved, resumed = interrupted_and_resumed(cfg, tmp_path, after=5)
    events = saved["engine"]["events"]
    assert {e["message"]["kind"] for e in events} == {"Smashed", "ClientModel"}
    assert_same_models(state(reference), state(resumed))


@pytest.mark.parametrize(
    ("knobs", "key"),
    [
        ({"server_order": "round_robin"}, "server_order"),
        ({"agg_every": 2}, "agg_every"),
        ({"participation": "with_replacement", "clients_per_round": 3}, "participation"),
        ({"aggregate_aux": False}, "aggregate_aux"),
        ({"arrival_jitter_s": 0.1}, "arrival_jitter_s"),
        ({"buffer_size": 7}, "buffer_size"),
    ],
)
def test_settings_it_cannot_run_are_refused_in_one_line_naming_the_key(tmp_path, knobs, key):
    with pytest.raises(ConfigError, match=rf"^algorithm\.{key}: ") as caught:
        fedge.run(config(tmp_path, "cse_fsl_async", "bad", **knobs))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "bad").exists()
