"""Smoke tests of the engine benchmark harness on a tiny workload (never a timing assertion)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks import engine, profile
from benchmarks.measure import flops_per_sample
from benchmarks.workloads import WORKLOADS, get_workload


@pytest.mark.ci
def test_harness_writes_a_report_and_skips_flower_cleanly(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engine, "flower_installed", lambda: False)
    out = tmp_path / "report.json"
    assert engine.main(["--workloads", "tiny", "--repeats", "1", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    tiny = report["workloads"]["tiny"]
    assert set(tiny["seconds"]) == {"batched", "sequential", "centralized"}  # no Flower column
    assert all(s > 0 for s in tiny["seconds"].values())
    assert tiny["agreement_max_abs_after_round_1"]["batched_vs_sequential"] < 1e-5
    assert tiny["samples"] == 240 and tiny["flops_per_round"]["executed"] > 0
    memory = tiny["memory"]
    assert memory["state_bytes"] == tiny["state_bytes"] > 0
    assert memory["peak_rss_round"] >= memory["state_bytes"] + memory["data_bytes"]
    assert report["matmul_peak_gflops"] > 0
    printed = capsys.readouterr()
    assert "tiny" in printed.out and "Flower column skipped" in printed.err


def test_flops_count_what_training_executes():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 5))
    x, y = torch.randn(4, 1, 3, 4), torch.tensor([0, 1, 2, 3])
    flops = flops_per_sample(model, x, y)
    assert flops["executed"] == 2 * 2 * 12 * 5  # forward + weight gradient; no input gradient
    assert flops["model"] == 3 * 2 * 12 * 5


@pytest.mark.parametrize("name", ["W1", "W2", "W3"])
def test_workloads_are_the_issue_settings(name):
    workload = get_workload(name)
    config = workload.config(device="cpu", executor="sequential", threads=2)
    assert config.partition.kind == "iid" and config.data.name == "mnist"
    assert config.partition.num_clients * {"W1": 600, "W2": 600, "W3": 60}[name] == 60_000
    assert config.algorithm.batch_size == workload.batch_size and config.algorithm.local_epochs == 1
    assert config.engine.executor == "sequential" and config.engine.threads == 2


def test_unknown_workload_names_the_known_ones():
    with pytest.raises(KeyError, match="W1"):
        get_workload("W9")
    assert {"W1", "W2", "W3", "tiny"} <= set(WORKLOADS)


def test_profile_prints_the_operators_of_a_round(capsys):
    assert profile.main(["tiny", "--threads", "1", "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny: ") and "aten::" in out


def test_family_summary_takes_the_larger_target_of_loop_over_3_and_the_peak_floor():
    from benchmarks.families import summarize

    off = {"seconds": {"loop": 6.0, "batched": 2.5, "sequential": 5.0}, "executed_flops": 70e9}
    result = summarize(off, {"seconds": {"loop": 6.0, "batched": 2.0}}, peak=50.0)
    assert result["speedup_vs_loop"] == 6.0 / 2.5 and result["sequential_speedup_vs_loop"] == 6.0 / 5.0
    assert result["target_seconds"] == 2.0  # 70 GFLOP at 70 % of 50 GFLOP/s is 2.0 s, loop / 3 too
    assert not result["target_met"]
    assert result["speedup_vs_loop_allocator_on"] == 3.0
    assert result["batched_fraction_of_peak"] == 70e9 / 2.5 / 50e9
    slow_peak = summarize(off, None, peak=10.0)
    assert slow_peak["target_seconds"] == 10.0 and slow_peak["target_met"]


@pytest.mark.slow
def test_scale_out_harness_reports_ratios_on_a_small_round(tmp_path):
    from benchmarks import scale_out

    out = tmp_path / "scale-out.json"
    argv = ["--clients", "40", "--samples", "12", "--hidden", "8", "--dataset", "synthetic", "--rounds", "1"]
    assert scale_out.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["speedup"] > 0 and 0 < report["peak_rss_ratio_per_rank"] < 2
    assert len(report["ranks_2"]["peak_rss"]) == 2
    assert report["checksum_difference"] < 1e-4  # the same round on one process and on two
    assert report["loadavg_before"]


def _small_run(algorithm: dict, executor: str):
    """A 4-client run on a tiny synthetic set (an MLP 36-16-4) for the loop agreement tests."""
    from fedge.api import resolve_config
    from fedge.runner.loop import build_run

    raw = {
        "seed": 5,
        "data": {"name": "synthetic", "num_train": 240, "num_test": 40, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "iid", "num_clients": 4},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "engine": {"executor": executor, "threads": 1},
        "output": {"plots": False},
        "algorithm": algorithm,
    }
    return build_run(resolve_config(raw, []))


@pytest.mark.parametrize("name", ["hist", "hfedavg"])
def test_hierarchical_loops_agree_with_fedge_after_a_round(name):
    from benchmarks.families import _max_diff
    from benchmarks.loops import HierarchicalLoop, HistLoop, fedge_global_state

    algorithm = {"name": name, "cells": 2, "edge_rounds": 2, "local_steps": 3, "batch_size": 8}
    algorithm["optimizer"] = {"lr": 0.1}
    loop = {"hist": HistLoop, "hfedavg": HierarchicalLoop}[name](_small_run(algorithm, "batched"))
    start = {k: v.clone() for k, v in loop.state().items()}
    loop.round(1)
    assert _max_diff(start, loop.state()) > 1e-2  # it trained
    for executor in ("batched", "sequential"):
        run = _small_run(algorithm, executor)
        run.round(1)
        assert _max_diff(fedge_global_state(run), loop.state()) < 1e-6


@pytest.mark.ci
def test_afind_loop_agrees_with_fedge_over_three_rounds():
    """Round 1 takes every neighbour (the cold-start top ``k0``), rounds 2-3 the adaptive threshold."""
    from benchmarks.families import _max_diff
    from benchmarks.loops import AfindLoop, fedge_bank_state

    algorithm = {
        "name": "afind",
        "k0": 3,
        "local_epochs": 1,
        "batch_size": 8,
        "optimizer": {"lr": 0.1, "momentum": 0.5},
        "ft_epochs": 0,
        "topology": {"kind": "full"},
    }
    loop = AfindLoop(_small_run(algorithm, "batched"))
    runs = [_small_run(algorithm, executor) for executor in ("batched", "sequential")]
    start = {k: v.clone() for k, v in loop.state().items()}
    for t in (1, 2, 3):
        loop.round(t)
        for run in runs:
            run.round(t)
            assert _max_diff(fedge_bank_state(run), loop.state()) < 1e-6
    assert _max_diff(start, loop.state()) > 1e-2
    assert runs[0].algorithm.selector.previous.sum(dim=1).tolist() != [3] * 4  # the threshold chose


@pytest.mark.ci
def test_family_benchmark_runs_only_the_algorithms_asked_for(tmp_path, capsys):
    from benchmarks import families

    out = tmp_path / "families.json"
    argv = ["--workloads", "W7", "--algorithms", "hist", "--clients", "4", "--repeats", "1"]
    assert families.main([*argv, "--no-allocator-on", "--device", "cpu", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    hist = report["workloads"]["W7"]["algorithms"]
    assert set(hist) == {"hist"}  # HFedAvg, W7's other algorithm, was left out
    assert hist["hist"]["allocator_off"]["agreement_max_abs_after_round_1"]["loop_vs_batched"] < 1e-5
    assert report["machine"]["device"] == "cpu" and "hist" in capsys.readouterr().out


def test_conv_benchmark_times_both_rules(capsys):
    from benchmarks import conv

    assert conv.main(["--clients", "2", "--batch", "2", "--repeats", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per_client_seconds"] > 0 and report["grouped_seconds"] > 0
    assert report["grouped_over_per_client"] == report["grouped_seconds"] / report["per_client_seconds"]


@pytest.mark.ci
@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="needs Debian's dataset-fashion-mnist"
)
def test_the_recording_benchmark_writes_its_ratio_and_attack_seconds(tmp_path):
    from benchmarks import recording

    out = tmp_path / "recording.json"
    recording.main(["--repeats", "1", "--rounds", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["overhead_ratio"] > 0 and report["bytes_per_recorded_round"] > 0
    assert {"decoder", "label_direction", "membership"} <= set(report["attack_seconds"])
