"""The same FedAvg round in a Flower 1.41 simulation (Ray back-end, Message API), for comparison.

Needs the optional extra (``pip install -e ".[flower]"``); ``benchmarks.engine`` imports this module
only when ``flwr`` is installed and otherwise leaves the Flower column empty.

Each simulated client (a Ray actor process) rebuilds the workload's fedge run once, so it holds the
same data and iid split, and trains its partition the way a Flower user would: ``nn.Module`` plus
``torch.optim.SGD``, on exactly the batches fedge's plan gives that client in that round. The server
runs Flower's own ``FedAvg`` strategy (all clients every round, weighted by example count) from the
same initial weights; the strategy's ``evaluate_fn`` hook, called before the first round and after
every round, supplies the round times and the aggregated model.
"""

from __future__ import annotations

import logging
import time
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

from benchmarks.workloads import get_workload
from fedge.algorithms import Algorithm
from fedge.runner.loop import build_run

client_app = ClientApp()


@cache
def _client_run(workload: str, device: str, seed: int) -> Algorithm:
    """The workload's fedge FedAvg, built once per client process (data, split and model)."""
    torch.set_num_threads(1)
    config = get_workload(workload).config(device=device, executor="sequential", seed=seed)
    return build_run(config).algorithm


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """One client's local epochs with plain PyTorch, on the batches fedge's plan gives it."""
    config = msg.content["config"]
    algorithm = _client_run(str(config["workload"]), str(config["device"]), int(config["seed"]))
    cfg, data, model = algorithm.cfg, algorithm.ctx.data, algorithm.model
    client = int(context.node_config["partition-id"])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr)
    plan = data.batch_plan([client], int(config["server-round"]), cfg.local_epochs, cfg.batch_size)
    for s in range(int(plan.steps[0])):
        idx = plan.client_batch(0, s)
        loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    metrics = MetricRecord({"num-examples": len(data.client_train[client])})
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=reply, reply_to=msg)


def run_flower(
    workload: str, initial: dict[str, torch.Tensor], rounds: int, device: str, cores: int, seed: int = 0
) -> dict[str, Any]:
    """Simulate ``rounds`` FedAvg rounds; round times and the model after round 1.

    ``initial`` is the global model's state dict. Ray gets ``cores`` CPUs and every client one
    (``cores`` clients train at once, each single-threaded), the usual simulation set-up for a CPU
    machine; on a GPU each actor also gets an equal share of the device.
    """
    clients = get_workload(workload).clients
    stamps: list[float] = []
    models: dict[int, dict[str, torch.Tensor]] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=clients,
            min_available_nodes=clients,
        )

        def on_round(server_round: int, arrays: ArrayRecord) -> None:
            stamps.append(time.perf_counter())
            if server_round == 1:
                models[1] = arrays.to_torch_state_dict()

        strategy.start(
            grid,
            ArrayRecord({k: v.detach().cpu() for k, v in initial.items()}),
            num_rounds=rounds,
            train_config=ConfigRecord({"workload": workload, "device": device, "seed": seed}),
            evaluate_fn=on_round,
        )

    resources: dict[str, float] = {"num_cpus": 1.0}
    if device.startswith("cuda"):
        resources["num_gpus"] = 1.0 / cores
    backend = {
        "client_resources": resources,
        "init_args": {"num_cpus": cores, "logging_level": logging.ERROR, "log_to_driver": False},
    }
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)
    try:
        run_simulation(server_app, client_app, num_supernodes=clients, backend_config=backend)
    finally:
        flwr_logger.setLevel(level)
    times = np.diff(stamps).tolist()
    if len(times) != rounds:
        raise RuntimeError(f"Flower simulation finished {len(times)} of {rounds} rounds")
    return {"round_seconds": times, "model_after_round_1": models.get(1)}
