"""Asynchronous FedBuff / FedAsync and deadline FedAvg on the simulated clock: what they must equal,
their determinism on both executors, and kill-and-resume with jobs in flight."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import children
import pytest
import torch
from async_cases import HETEROGENEOUS, IDENTICAL, interrupted_and_resumed, rows
from cases import tiny

import fedge
from fedge import results
from fedge.checkpoint import load
from fedge.errors import ConfigError
from fedge.system.events import EventQueue


def config(tmp_path: Path, algorithm: str, name: str, rounds: int = 4, **knobs) -> dict:
    cfg = tiny(algorithm, tmp_path, rounds=rounds)
    cfg["partition"]["num_clients"] = 6
    cfg["algorithm"].update(fraction=0.5, **knobs)
    cfg["output"]["name"] = name
    cfg["engine"] = {"threads": 1}
    return cfg


def final_params(result: fedge.Result) -> dict[str, torch.Tensor]:
    return load(result.run_dir / results.CHECKPOINT).state["algorithm"]["params"]


@pytest.mark.parametrize("executor", ["batched", "sequential"])
def test_fedbuff_with_k_equal_to_the_cohort_on_identical_devices_is_fedavg(tmp_path, executor):
    runs = {}
    for algorithm in ("fedavg", "fedbuff"):
        cfg = config(tmp_path, algorithm, f"{algorithm}-{executor}")
        cfg["system"] = IDENTICAL
        cfg["engine"]["executor"] = executor
        runs[algorithm] = fedge.run(cfg)
    sync, buffered = runs["fedavg"], runs["fedbuff"]
    for name, value in final_params(sync).items():
        assert torch.equal(value, final_params(buffered)[name]), name
    for a, b in zip(sync.metrics, buffered.metrics, strict=True):
        assert a["accuracy"] == b["accuracy"] and a["loss"] == b["loss"]
        assert a["sim_seconds"] == b["sim_seconds"] and a["mb_total"] == b["mb_total"]
        assert b["staleness_max"] == 0 and b["participants"] == 3


def test_deadline_fedavg_without_deadline_or_failures_is_fedavg(tmp_path):
    sync = fedge.run(config(tmp_path, "fedavg", "sync"))
    deadline = fedge.run(config(tmp_path, "fedavg_deadline", "deadline"))
    for name, value in final_params(sync).items():
        assert torch.equal(value, final_params(deadline)[name]), name
    keep = ("accuracy", "loss", "sim_seconds", "sim_joules", "mb_total", "sim_seconds_by_phase")
    assert [{k: r[k] for k in keep} for r in sync.metrics] == [
        {k: r[k] for k in keep} for r in deadline.metrics
    ]


def test_a_deadline_drops_stragglers_and_the_ledger_keeps_what_they_sent(tmp_path):
    cfg = config(tmp_path, "fedavg_deadline", "late", rounds=6, deadline_s=0.08)
    # half the clients on a 250x narrower channel: model down in ~0.047 s, up in ~0.059 s
    cfg["system"] = {"devices": {"bandwidth_hz": [[5e6, 5e6], [2e4, 2e4]]}}
    result = fedge.run(cfg)
    before, late_rounds = 0.0, 0
    for row in result.metrics:
        slow = row["late"]
        assert row["participants"] + slow == 3
        if slow:  # the server waited until the deadline, the slow ones' uploads cut there
            assert row["sim_seconds"] - before == pytest.approx(0.08)
            late_rounds += 1
        else:
            assert row["sim_seconds"] - before < 0.01
        before = row["sim_seconds"]
    assert late_rounds
    late = result.metrics[-1]["bits_by_kind"]["model_up_late"]
    dropped = sum(row["late"] for row in result.metrics)
    assert 0 < late < 21120 * dropped  # part of each dropped upload (one model: 21,120 bits)
    over = fedge.run(
        {
            **cfg,
            "algorithm": {**cfg["algorithm"], "over_select": 1.0},
            "output": {**cfg["output"], "name": "over"},
        }
    )
    for row in over.metrics:  # six selected, the three fast ones first: nobody waits for the deadline
        assert (row["selected"], row["participants"], row["late"]) == (6, 3, 3)
        assert row["sim_seconds"] < 0.01 * row["round"]


def test_partial_work_counts_the_steps_done_before_the_deadline(tmp_path):
    cfg = config(tmp_path, "fedavg_deadline", "partial", rounds=4, deadline_s=0.13, late="partial")
    cfg["system"] = {"devices": {"cpu_hz": [[1e9, 1e9], [1e6, 1e6]]}}  # slow: one of its two steps fits
    result = fedge.run(cfg)
    assert all(row["late"] == 0 for row in result.metrics)
    assert sum(row["partial"] for row in result.metrics) > 0
    dropped = fedge.run(
        {
            **cfg,
            "algorithm": {**cfg["algorithm"], "late": "drop"},
            "output": {**cfg["output"], "name": "drop"},
        }
    )
    assert [r["partial"] for r in result.metrics] == [r["late"] for r in dropped.metrics]
    mine, theirs = final_params(result), final_params(dropped)
    assert any(not torch.equal(mine[k], theirs[k]) for k in mine)  # the partial steps were averaged in


def test_async_runs_report_staleness_and_agree_on_both_executors(tmp_path):
    results_ = {}
    for executor in ("batched", "sequential"):
        cfg = config(tmp_path, "fedbuff", f"buff-{executor}", rounds=6, buffer_size=2)
        cfg["system"] = HETEROGENEOUS
        cfg["engine"]["executor"] = executor
        results_[executor] = fedge.run(cfg)
    batched, sequential = results_["batched"], results_["sequential"]
    assert max(row["staleness_max"] for row in batched.metrics) > 0
    times = [row["sim_seconds"] for row in batched.metrics]
    assert times == sorted(times) and times[0] > 0
    assert [r["sim_seconds"] for r in sequential.metrics] == times  # the same events, in the same order
    for name, value in final_params(batched).items():
        torch.testing.assert_close(final_params(sequential)[name], value, atol=1e-5, rtol=1e-5)


def test_fedasync_mixes_each_arrival_by_its_staleness(tmp_path):
    cfg = config(tmp_path, "fedasync", "async", rounds=6)
    cfg["system"] = HETEROGENEOUS
    first = fedge.run(cfg)
    assert all(row["participants"] == 1 for row in first.metrics)
    assert any(row["staleness_max"] > 0 for row in first.metrics)
    again = fedge.run({**cfg, "output": {**cfg["output"], "name": "async-again"}})
    assert rows(again) == rows(first)  # same seed, same events


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync"])
def test_an_interrupted_async_run_resumes_bit_identically(tmp_path, algorithm):
    cfg = config(tmp_path / "ref", algorithm, "run", rounds=8)
    cfg["system"] = HETEROGENEOUS
    cfg["output"]["checkpoint_every"] = 3
    # after round 5; the last checkpoint is round 3's, with jobs in flight
    reference, saved, resumed = interrupted_and_resumed(cfg, tmp_path, after=5)
    assert saved["queue"]["jobs"]  # jobs in flight saved
    for name, value in final_params(reference).items():
        assert torch.equal(value, final_params(resumed)[name])


def test_the_event_queue_pops_by_time_then_dispatch_and_survives_a_checkpoint():
    queue = EventQueue()
    queue.push(2.0, client=7, version=0, start=0.0)
    queue.push(1.0, client=3, version=0, start=0.0)
    queue.push(2.0, client=1, version=1, start=0.5)
    copy = EventQueue()
    copy.load_state_dict(queue.state_dict())
    assert [job.client for job in (queue.pop(), queue.pop(), queue.pop())] == [3, 7, 1]
    assert [job.client for job in (copy.pop(), copy.pop(), copy.pop())] == [3, 7, 1]
    assert copy.next_seq == 3


def test_a_buffer_larger_than_the_clients_in_flight_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^algorithm\.buffer_size: 4 updates per aggregation, but only 3"):
        fedge.run(config(tmp_path, "fedbuff", "big", buffer_size=4))
    assert not (tmp_path / "big").exists()


def test_the_devices_reach_the_async_clock(tmp_path):
    fast = config(tmp_path, "fedbuff", "fast", rounds=2)
    fast["system"] = {"devices": {"cpu_hz": 1e9}}
    slow = config(tmp_path, "fedbuff", "slow", rounds=2)
    slow["system"] = {"devices": {"cpu_hz": 1e6}}
    quick, late = fedge.run(fast), fedge.run(slow)
    assert late.metrics[-1]["sim_seconds"] > 10 * quick.metrics[-1]["sim_seconds"]
    assert late.metrics[-1]["sim_seconds_by_phase"]["client_compute"] > 0
    assert (late.run_dir / "devices.csv").is_file()


def test_a_sigkilled_async_run_resumes_bit_identically(tmp_path):
    cfg = config(tmp_path / "ref", "fedbuff", "run", rounds=12, buffer_size=2)
    cfg["system"] = HETEROGENEOUS
    cfg["output"]["checkpoint_every"] = 2
    reference = fedge.run(cfg)
    killed = {**cfg, "output": {**cfg["output"], "dir": str(tmp_path / "killed")}}
    run_dir = tmp_path / "killed" / "run"
    pid = os.fork()
    if pid == 0:
        try:
            fedge.run(killed)
        finally:
            os._exit(0)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    children.reap(pid)
    assert not (run_dir / "summary.json").exists(), "the run finished before it could be killed"
    resumed = fedge.resume(run_dir)
    assert rows(resumed) == rows(reference)
    assert (run_dir / "ledger.csv").read_bytes() == (reference.run_dir / "ledger.csv").read_bytes()


def test_once_every_budget_is_spent_the_async_rounds_are_empty(tmp_path):
    cfg = config(tmp_path, "fedbuff", "spent", rounds=8, buffer_size=2)
    cfg["system"] = {"devices": {"energy_budget_j": 1e-4}}  # about one job each
    result = fedge.run(cfg)
    last = result.metrics[-1]
    assert result.metrics[0]["participants"] == 2
    assert last["participants"] == 0 and last["in_flight"] == 0
    versions = [row["model_version"] for row in result.metrics]
    assert versions[-1] == versions[-2] < 8  # no more aggregations, the run still finishes
    assert result.metrics[-1]["sim_seconds"] == result.metrics[-2]["sim_seconds"]


def test_the_async_critical_path_adds_up_to_the_simulated_time(tmp_path):
    cfg = config(tmp_path, "fedasync", "path", rounds=6)
    cfg["system"] = HETEROGENEOUS
    for row in fedge.run(cfg).metrics:
        assert sum(row["sim_seconds_by_phase"].values()) == pytest.approx(row["sim_seconds"], rel=1e-9)
        assert row["sim_seconds_by_phase"]["client_compute"] > 0
