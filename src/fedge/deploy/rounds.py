"""The server side of each deployed algorithm: the simulated algorithm's own round, with the clients'
work done by their SuperNodes through a transport.

Each class is the registered algorithm with ``run_round`` replaced: broadcasts, uploads, server steps,
averaging, the simulated clock and every ledger entry go through the same methods and links as in a
simulation, fed with what the nodes sent back, so a deployed run without faults has the simulation's
numbers. A client that drops out of a round (no reply in time, an error, a malformed reply) is left out
of the rest of that round: the others are averaged with their weights renormalised and the metrics row
names the dropped nodes (``dropped``, ``dropped_nodes``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedge.algorithms.fedavg import FedAvg, sample_clients
from fedge.algorithms.hierarchical.hfedavg import HFedAvg
from fedge.algorithms.hierarchical.hist import HIST
from fedge.comm import nodes
from fedge.deploy.split_rounds import DeployedCseFsl, DeployedSplitFedV2
from fedge.deploy.transport import Outgoing, Transport, dropout_figures
from fedge.deploy.wire import F32, WIRE_DTYPES, expect, wire_dtype
from fedge.engine import ClientBank, weighted_sum
from fedge.errors import ConfigError, FedgeError
from fedge.metrics import RoundReport
from fedge.system import star_round, training_flops
from fedge.tensors import floating, rows


class DeployedFedAvg(FedAvg):
    """FedAvg with each participant's local epochs on its own node (message ``train``)."""

    transport: Transport

    def check_deployable(self) -> None:
        """Refuse codecs the runtime does not carry."""
        for key, codec in (("codec_up", self.cfg.codec_up), ("codec_down", self.cfg.codec_down)):
            if codec not in WIRE_DTYPES:
                raise ConfigError(f"algorithm.{key}", f"{codec!r} cannot be deployed; use fp32 or fp16")

    def run_round(self, t: int) -> RoundReport:
        ctx, cfg = self.ctx, self.cfg
        clients = sample_clients(ctx.seed, t, ctx.data.num_clients, cfg.fraction)
        model = {**self.params, **floating(self.buffers)}
        down = self.down.send(t, nodes.SERVER, nodes.clients(clients), "model_down", model)
        send_as, reply_as = wire_dtype(cfg.codec_down), wire_dtype(cfg.codec_up)
        outgoing = {int(c): Outgoing({"model_down": (down.payload, send_as)}) for c in clients}
        specs = {c: {"model_up": expect(model, reply_as)} for c in outgoing}
        replies = self.transport.exchange(t, "train", outgoing, specs)
        alive = np.array([c for c in clients if int(c) in replies], dtype=np.int64)
        if not len(alive):
            raise FedgeError(f"round {t}: no client replied ({self.transport.dropped.get(t)})")
        answers = [replies[int(c)] for c in alive]
        trained = {k: torch.stack([a.records["model_up"][k] for a in answers]).to(ctx.device) for k in model}
        up = self.up.send(t, nodes.clients(alive), nodes.SERVER, "model_up", trained, stacked=True)
        samples = np.array([a.metrics["samples"] for a in answers])
        flops = training_flops(self.flops_per_sample, samples)
        ctx.system.charge(star_round(ctx.system, t, alive, flops, ctx.network.traffic(t)))
        sizes = torch.as_tensor(ctx.data.client_sizes(alive), dtype=torch.float64)
        weights = (sizes / sizes.sum()).to(ctx.device)
        kept = {k: v.expand(len(alive), *v.shape) for k, v in self.buffers.items()}  # counters stay home
        self.params = weighted_sum({k: up.payload[k] for k in self.params}, weights)
        self.buffers = weighted_sum({k: up.payload.get(k, v) for k, v in kept.items()}, weights)
        ctx.network.hold(nodes.clients(alive), "model", {**self.params, **self.buffers})
        losses = torch.tensor([a.metrics["loss"] for a in answers], dtype=torch.float32)
        train_loss = float((losses.double() * weights.cpu()).sum())
        return RoundReport(train_loss, {"participants": len(alive), **dropout_figures(self.transport, t)})


class RemoteEdgeTraining:
    """Stands in for the executor during a deployed hierarchical round: each ``train`` call is one edge
    round, whose rows (clients) train on their nodes (message ``train``, config ``edge_round``).

    A client that drops out of an edge round keeps the model its edge server sent it, so the cell's
    mean counts it as a client that did not move (cells keep their fixed membership)."""

    def __init__(self, algorithm: Any, round_: int, executor: Any):
        self.algorithm = algorithm
        self.round = round_
        self.noise = executor.noise
        self.edge_round = 0

    def train(self, step, bank: ClientBank, plan, data, lr: float) -> torch.Tensor:
        t, e = self.round, self.edge_round
        self.edge_round += 1
        model = {**bank.params, **floating(bank.buffers)}
        outgoing = {
            c: Outgoing(
                {"model_down": (rows(model, r), F32), "opt": (rows(bank.opt_state, r), None)},
                {"edge_round": e},
            )
            for r, c in enumerate(bank.clients)
        }
        spec = {"model_up": expect(rows(model, 0), F32)}
        replies = self.algorithm.transport.exchange(t, "train", outgoing, {c: spec for c in bank.clients})
        losses = torch.zeros(len(bank), device=self.algorithm.ctx.device)
        params, buffers = dict(bank.params), dict(bank.buffers)
        for r, c in enumerate(bank.clients):
            if c not in replies:
                continue
            trained = replies[c].records["model_up"]
            for k, v in trained.items():
                target = params if k in params else buffers
                target[k] = target[k].index_put((torch.tensor([r]),), v.to(target[k]).unsqueeze(0))
            losses[r] = replies[c].metrics["loss"]
        answered = [r for r, c in enumerate(bank.clients) if c in replies]
        if answered and len(answered) < len(bank):  # the round's loss is the mean over those that trained
            missing = [r for r, c in enumerate(bank.clients) if c not in replies]
            losses[missing] = losses[answered].mean()
        bank.adopt(params, buffers, bank.opt_state, owned=False)
        return losses


class DeployedHierarchy:
    """HIST and HFedAvg with the clients on their nodes; the edge servers' averaging, the cloud's merge,
    AirComp's noise and the radio model run in the server app: the edge tier is logical (one process
    computes every cell's step), while each client's H local steps run on its own SuperNode."""

    transport: Transport

    def check_deployable(self) -> None:
        """Every setting is carried (the links are fp32)."""

    def run_round(self, t: int) -> RoundReport:
        ctx = self.ctx
        executor = ctx.executor
        ctx.executor = RemoteEdgeTraining(self, t, executor)
        try:
            report = super().run_round(t)
        finally:
            ctx.executor = executor
        return RoundReport(report.train_loss, {**report.extra, **dropout_figures(self.transport, t)})


class DeployedHFedAvg(DeployedHierarchy, HFedAvg):
    """HFedAvg on the runtime."""


class DeployedHist(DeployedHierarchy, HIST):
    """HIST on the runtime (its submodel masks travel to the clients in the optimizer state)."""


DEPLOYED = {
    "fedavg": DeployedFedAvg,
    "cse_fsl": DeployedCseFsl,
    "splitfed_v2": DeployedSplitFedV2,
    "hfedavg": DeployedHFedAvg,
    "hist": DeployedHist,
}
