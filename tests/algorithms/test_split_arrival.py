"""``server_order: arrival``: a shared split server serves uploads in the order they reach it on the
simulated timeline, and the round's simulated time includes their queue waits."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
import torch
from tiers import parametrize_first_by_default

import fedge
from fedge.errors import ConfigError
from fedge.runner.loop import build_run
from fedge.system import training_flops
from fedge.system.split import serve_queue

SLOW_SERVER = {"bandwidth_hz": 2e4, "server_cpu_hz": 2e4, "distance_min_m": 10.0, "distance_max_m": 3000.0}


def config(algorithm: dict, executor: str = "sequential", clients: int = 3) -> dict:
    return {
        "seed": 2,
        "rounds": 2,
        "data": {"name": "synthetic", "num_train": 240, "num_test": 60, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "iid", "num_clients": clients},
        "model": {"name": "mlp", "cut": 1, "options": {"hidden": [16, 12]}},
        "algorithm": {"batch_size": 8, "optimizer": {"lr": 0.1}, **algorithm},
        "system": SLOW_SERVER,
        "engine": {"executor": executor},
        "output": {"plots": False},
    }


def built(raw: dict):
    return build_run(fedge.resolve_config(raw)).algorithm


def bits_of(algorithm, kind: str) -> np.ndarray:
    """Each client's bits of ``kind`` (one transfer per client in these rounds)."""
    out = np.zeros(algorithm.ctx.data.num_clients)
    for row in csv.DictReader(io.StringIO(algorithm.ctx.network.ledger.to_csv())):
        if row["kind"] == kind:
            out[int((row["dst"] if kind.endswith("down") else row["src"]).split(":")[1])] += int(row["bits"])
    return out


def test_serve_queue_is_first_come_first_served():
    order, start, finish, free = serve_queue(np.array([3.0, 1.0, 1.5]), np.array([1.0, 2.0, 1.0]), 0.5)
    assert order.tolist() == [1, 2, 0]
    assert start.tolist() == [4.0, 1.0, 3.0] and finish.tolist() == [5.0, 3.0, 4.0] and free == 5.0


def test_a_slow_clients_upload_is_served_after_a_fast_ones_and_its_wait_is_on_the_clock():
    algorithm = built(config({"name": "splitfed_v2", "server_order": "arrival", "local_steps": 1}))
    system, orders = algorithm.ctx.system, []
    serve = algorithm.server.serve

    def spy(batch, lr, grad_z, order):
        orders.append(list(order))
        return serve(batch, lr, grad_z, order)

    algorithm.server.serve = spy
    report = algorithm.run_round(1)
    rates = system.link(1).up_bps
    fastest_first = np.argsort(-rates, kind="stable").tolist()
    assert fastest_first != [0, 1, 2]  # round robin would serve a slower client first
    assert orders == [fastest_first]

    # the round by hand: download, one step, upload, FIFO server, gradient back, model upload
    clients = np.arange(3)
    flops = algorithm.flops
    down = system.download(clients, bits_of(algorithm, "model_down"), 1).seconds
    compute = system.client_compute(training_flops(flops.trunk, np.full(3, 8.0))).seconds
    smashed = bits_of(algorithm, "smashed_up") + bits_of(algorithm, "labels_up")
    arrival = down + compute + system.upload(clients, smashed, 1).seconds
    service = system.server_compute(training_flops(flops.server, np.full(3, 8.0))).seconds
    _, start, finish, free = serve_queue(arrival, service, 0.0)
    grads = system.download(clients, bits_of(algorithm, "grad_down"), 1).seconds
    model_up = system.upload(clients, bits_of(algorithm, "model_up"), 1).seconds
    expected = max(float((finish + grads + model_up).max()), free)
    wait = float((start - arrival).sum())
    assert wait > 0.1 * expected  # uploads really queue behind the slow server
    assert report.extra["queue_wait_s"] == pytest.approx(wait, rel=1e-9)
    assert system.clock.seconds == pytest.approx(expected, rel=1e-9)


@parametrize_first_by_default(
    "algorithm",
    [
        {"name": "splitfed_v2", "server_order": "arrival", "arrival_jitter_s": 0.5},
        {"name": "cse_fsl", "h": 2, "server_order": "arrival", "arrival_jitter_s": 0.5},
    ],
)
def test_sequential_and_batched_executors_agree_and_runs_repeat(algorithm):
    runs = []
    for executor in ("sequential", "batched", "batched"):
        alg = built(config(algorithm, executor))
        reports = [alg.run_round(t) for t in (1, 2)]
        params = {**alg.client["params"], **alg.server.params}
        runs.append((params, alg.ctx.system.clock.seconds, [r.extra["queue_wait_s"] for r in reports]))
    (a, secs_a, wait_a), (b, secs_b, wait_b), (c, secs_c, wait_c) = runs
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert secs_a == pytest.approx(secs_b, rel=1e-12) and wait_a == pytest.approx(wait_b, rel=1e-12)
    assert all(torch.equal(b[k], c[k]) for k in b) and secs_b == secs_c and wait_b == wait_c
    assert min(wait_a) > 0


def test_arrival_changes_the_order_not_the_data():
    plain = built(config({"name": "splitfed_v2", "local_steps": 1}))
    arrival = built(config({"name": "splitfed_v2", "local_steps": 1, "server_order": "arrival"}))
    plain.run_round(1), arrival.run_round(1)
    assert plain.ctx.network.ledger.to_csv() == arrival.ctx.network.ledger.to_csv()
    assert any(not torch.equal(plain.server.params[k], arrival.server.params[k]) for k in plain.server.params)


def test_lightweight_fedsl_queues_on_the_clock_only():
    base = {"name": "light_fedsl", "optimizer": {"lr": 0.1}, "agg_interval": 1}
    parallel, arrival = built(config(base)), built(config({**base, "server_order": "arrival"}))
    parallel.run_round(1)
    report = arrival.run_round(1)
    assert report.extra["queue_wait_s"] > 0
    assert all(
        torch.equal(parallel.server.params[k], arrival.server.params[k]) for k in parallel.server.params
    )
    assert arrival.ctx.system.clock.seconds > parallel.ctx.system.clock.seconds


def test_arrival_needs_one_shared_server_model():
    with pytest.raises(ConfigError, match="algorithm.server_order"):
        built(config({"name": "splitfed_v1", "server_order": "arrival"}))
