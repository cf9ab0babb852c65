"""Asynchronous FedBuff / FedAsync and deadline FedAvg on the simulated clock: what they must equal,
their determinism on both executors, and kill-and-resume with jobs in flight."""

from __future__ import annotations

import heapq
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import children
import numpy as np
import pytest
import torch
from async_cases import HETEROGENEOUS, IDENTICAL, interrupted_and_resumed, rows
from cases import tiny
from tiers import parametrize_first_by_default

import fedge
from fedge.algorithms.asynchronous.config import FedAsyncConfig
from fedge.algorithms.asynchronous.fedasync import staleness_weight
from fedge.algorithms.asynchronous.fedbuff import FedBuff
from fedge.algorithms.asynchronous.server import delta
from fedge.algorithms.asynchronous.work import ProximalLoss
from fedge.engine import classification_loss
from fedge.errors import ConfigError
from fedge.files import results
from fedge.runner.checkpoint import load
from fedge.runtime.asynchronous import AsyncEngine, Dispatch, Dispatched


def config(tmp_path: Path, algorithm: str, name: str, rounds: int = 4, **knobs) -> dict:
    cfg = tiny(algorithm, tmp_path, rounds=rounds)
    cfg["partition"]["num_clients"] = 6
    cfg["algorithm"].update(fraction=0.5, **knobs)
    cfg["output"]["name"] = name
    cfg["engine"] = {"threads": 1}
    return cfg


def final_params(result: fedge.Result) -> dict[str, torch.Tensor]:
    return load(result.run_dir / results.CHECKPOINT).state["algorithm"]["params"]


@parametrize_first_by_default("executor", ["batched", "sequential"])
def test_fedbuff_with_sample_weights_and_k_the_cohort_on_identical_devices_is_fedavg(tmp_path, executor):
    runs = {}
    for algorithm in ("fedavg", "fedbuff"):
        knobs = {"weighting": "samples"} if algorithm == "fedbuff" else {}
        cfg = config(tmp_path, algorithm, f"{algorithm}-{executor}", **knobs)
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
    assert first.summary["aggregation"] == {"buffer": ["mean"]}  # each mix goes through the buffer's pipeline


@parametrize_first_by_default(
    ("algorithm", "knobs"),
    [
        ("fedbuff", {}),
        ("fedbuff", {"weighting": "samples"}),
        ("fedasync", {}),
        ("fedasync", {"staleness": "hinge", "hinge_b": 0, "hinge_a": 2.0, "proximal_mu": 0.5}),
    ],
)
def test_an_interrupted_async_run_resumes_bit_identically(tmp_path, algorithm, knobs):
    cfg = config(tmp_path / "ref", algorithm, "run", rounds=8, **knobs)
    cfg["system"] = HETEROGENEOUS
    cfg["output"]["checkpoint_every"] = 3
    # after round 5; the last checkpoint is round 3's, with jobs in flight
    reference, saved, resumed = interrupted_and_resumed(cfg, tmp_path, after=5)
    assert saved["engine"]["events"]  # jobs in flight saved
    for name, value in final_params(reference).items():
        assert torch.equal(value, final_params(resumed)[name])


@dataclass(frozen=True)
class Note:
    """A stand-in payload of a job."""

    tag: int


class Scripted:
    """A policy that dispatches the messages it is given (no training, no energy, no storage)."""

    concurrency = 3

    def __init__(self) -> None:
        self.next: list[Dispatch] = []

    def dispatch(self, t, clients, version):
        return Dispatched(self.next)

    def stored(self):
        return None


def test_the_event_queue_pops_by_time_then_dispatch_and_survives_a_checkpoint():
    policy = Scripted()
    engine = AsyncEngine(None, policy, (Note,))  # type: ignore[arg-type]
    policy.next = [Dispatch(7, 2.0, Note(0)), Dispatch(3, 1.0, Note(1))]
    engine.dispatch(1, np.array([7, 3]))
    engine.now, engine.version = 0.5, 1
    policy.next = [Dispatch(1, 1.5, Note(2))]
    engine.dispatch(1, np.array([1]))
    copy = AsyncEngine(None, Scripted(), (Note,))  # type: ignore[arg-type]
    copy.load_state_dict(engine.state_dict())
    for queue in (engine, copy):
        popped = [heapq.heappop(queue.events) for _ in range(3)]
        assert [(e.client, e.version, e.start, e.message.payload) for e in popped] == [
            (3, 0, 0.0, Note(1)), (7, 0, 0.0, Note(0)), (1, 1, 0.5, Note(2))
        ]
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


def recorded_aggregations(monkeypatch) -> list[dict]:
    """Every FedBuff aggregation of the runs that follow: its updates, staleness and the model before and
    after."""
    seen: list[dict] = []
    original = FedBuff.aggregate

    def recording(self, t, updates):
        before = {k: v.clone() for k, v in self.params.items()}
        stale = [self.staleness(u) for u in updates]
        original(self, t, updates)
        sizes = [float(self.sizes[u.client]) for u in updates]
        seen.append(
            {"updates": updates, "stale": stale, "sizes": sizes, "before": before, "after": dict(self.params)}
        )

    monkeypatch.setattr(FedBuff, "aggregate", recording)
    return seen


def test_fedbuff_defaults_to_the_papers_k_of_ten_below_the_clients_in_flight(tmp_path):
    """Nguyen et al. aggregate every K = 10 updates with far more clients in flight; K used to be the
    clients in flight (here 12)."""
    cfg = config(tmp_path, "fedbuff", "paper-k", rounds=2)
    cfg["partition"]["num_clients"] = 24
    cfg["system"] = HETEROGENEOUS
    result = fedge.run(cfg)
    assert [row["participants"] for row in result.metrics] == [10, 10]


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_fedbuff_weights_each_update_one_over_k_or_by_its_samples(tmp_path, monkeypatch, weighting):
    """x += server_lr sum_k w_k s(tau_k) delta_k with w_k = 1/K (the paper's, the default) or the sample
    shares; checked against the updates each aggregation received, stale ones included."""
    seen = recorded_aggregations(monkeypatch)
    knobs = {} if weighting == "uniform" else {"weighting": weighting}
    cfg = config(tmp_path, "fedbuff", weighting, rounds=5, buffer_size=2, server_lr=0.7, **knobs)
    cfg["partition"].update(kind="dirichlet", alpha=1.0)  # unequal shards
    cfg["system"] = HETEROGENEOUS
    fedge.run(cfg)
    assert any(max(a["stale"]) > 0 for a in seen)
    assert any(len(set(a["sizes"])) > 1 for a in seen)
    for aggregation in seen:
        updates = aggregation["updates"]
        sizes = [1.0] * len(updates) if weighting == "uniform" else aggregation["sizes"]
        weights = [n / sum(sizes) for n in sizes]
        for name, before in aggregation["before"].items():
            step = sum(
                w * (1.0 + tau) ** -0.5 * delta(u)[name].double()
                for w, tau, u in zip(weights, aggregation["stale"], updates, strict=True)
            )
            expected = before.double() + 0.7 * step
            torch.testing.assert_close(aggregation["after"][name].double(), expected, rtol=1e-5, atol=1e-6)


def test_fedbuff_weightings_differ_on_unequal_shards(tmp_path):
    runs = {}
    for weighting in ("uniform", "samples"):
        cfg = config(tmp_path, "fedbuff", weighting, rounds=2, buffer_size=2, weighting=weighting)
        cfg["partition"].update(kind="dirichlet", alpha=1.0)
        runs[weighting] = final_params(fedge.run(cfg))
    assert any(not torch.equal(runs["uniform"][k], runs["samples"][k]) for k in runs["uniform"])


def test_fedasync_staleness_functions_are_the_papers():
    """Xie et al.'s constant, polynomial (1 + tau)^-a and hinge: 1 up to b versions, then 1/(a(tau-b)+1)."""
    hinge = FedAsyncConfig(staleness="hinge", hinge_a=10.0, hinge_b=4)
    assert [staleness_weight(hinge, tau) for tau in (0, 4, 5, 7)] == [1.0, 1.0, 1 / 11, 1 / 31]
    poly = FedAsyncConfig(staleness="polynomial", exponent=0.5)
    assert staleness_weight(poly, 3) == pytest.approx(0.5)
    assert staleness_weight(FedAsyncConfig(staleness="constant"), 9) == 1.0


def test_fedasync_hinge_mixes_stale_updates_in_less(tmp_path):
    runs = {}
    for staleness in ("constant", "hinge"):
        cfg = config(tmp_path, "fedasync", staleness, rounds=6, staleness=staleness, hinge_b=0)
        cfg["system"] = HETEROGENEOUS
        runs[staleness] = fedge.run(cfg)
    assert rows(runs["constant"])[0]["accuracy"] == rows(runs["hinge"])[0]["accuracy"]  # fresh: equal
    assert final_params(runs["constant"]).keys() == final_params(runs["hinge"]).keys()
    assert any(
        not torch.equal(final_params(runs["constant"])[k], final_params(runs["hinge"])[k])
        for k in final_params(runs["hinge"])
    )


def test_the_proximal_objective_adds_the_pull_to_the_received_model():
    """rho/2 ||x - x_tau||^2 on top of the loss, its gradient rho (x - x_tau); the anchor passes through."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    anchor = {f"anchor::{k}": v.detach() + 0.5 for k, v in params.items()}
    x, y, w = torch.randn(4, 3), torch.tensor([0, 1, 1, 0]), torch.ones(4)
    plain, _ = classification_loss(model)(params, {}, x, y, w)
    proximal, buffers = ProximalLoss(classification_loss(model), 0.2)(params, anchor, x, y, w)
    assert proximal.item() == pytest.approx(
        plain.item() + 0.5 * 0.2 * 0.25 * sum(v.numel() for v in params.values())
    )
    assert set(buffers) == set(anchor)
    grads = torch.autograd.grad(proximal - plain, list(params.values()))
    for g in grads:
        torch.testing.assert_close(g, torch.full_like(g, -0.2 * 0.5))


@pytest.mark.parametrize("executor", ["batched", "sequential"])
def test_fedasync_proximal_term_keeps_clients_near_the_model_they_received(tmp_path, monkeypatch, executor):
    """With rho the local models drift less from the model they received; both executors train it."""
    drift: dict[float, list[float]] = {}
    original = AsyncEngine.arrive

    for mu in (0.0, 5.0):
        drift[mu] = []

        def arrive(self, t, event, mu=mu):
            original(self, t, event)
            change = delta(self.arrived[-1])
            drift[mu].append(float(sum((v.double() ** 2).sum() for v in change.values())))

        monkeypatch.setattr(AsyncEngine, "arrive", arrive)
        cfg = config(tmp_path, "fedasync", f"mu-{mu}-{executor}", rounds=3, proximal_mu=mu)
        cfg["engine"]["executor"] = executor
        fedge.run(cfg)
    assert len(drift[0.0]) == len(drift[5.0])
    assert all(a > b for a, b in zip(drift[0.0], drift[5.0], strict=True))
