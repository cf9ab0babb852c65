"""Measurement harness: run any registered algorithm round by round and record the theorems' quantity.

Two kinds of run:

- :func:`measured_run`: a normal run (``runner.build_run``) with the squared gradient norm of the global
  objective measured at the start (round 0) and after every ``every`` rounds, next to the algorithm's own
  metrics. Nothing is written to disk.
- P1 through an algorithm (:func:`p1_built`, :func:`p1_trace`): one side of the oracle problem P1 posed as
  a model + federated data set that a classification algorithm trains without knowing it. The model has
  one parameter vector w (the P1 iterate x, starting at the problem's x0); every sample of client i carries
  the centre c_i; its logits ``[0, v]`` with ``v = z + log(1 - e^-z)`` make the cross-entropy of label 0
  equal ``z = F_i(w) + C`` exactly (C > beta d keeps z > 0). In training mode each sample adds a noise
  term whose value is cancelled and whose gradient is ``e_b ~ N(0, B sigma_L^2 / d I)``, so a size-B
  mini-batch gradient is ``grad F_i(w)`` plus noise of variance exactly sigma_L^2 (as in P1), drawn from
  torch's generator that the algorithm seeds per round from the run seed. Each client holds K * B copies
  of its sample, so one local epoch of batch B is K local steps. The measured quantity is the exact
  ``||grad F(w)||^2`` of P1, not an estimate. This needs an algorithm that trains one full model with
  cross-entropy and keeps ``params`` in its state (FedAvg, centralized); the split algorithms' auxiliary
  heads would see a P1 client output they cannot reproduce, so they are measured on real data with
  :func:`fedge.empirical.metrics.split_grad_norms` instead.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.algorithms import ALGORITHMS, Algorithm, Context
from fedge.algorithms.base import executor_name
from fedge.comm import Ledger, Network
from fedge.config import RunConfig
from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.empirical.metrics import global_grad_norms
from fedge.engine import make_executor
from fedge.errors import ConfigError
from fedge.models import SplitModel
from fedge.runner.loop import Built
from fedge.system import SystemModel
from fedge.theory.oracle import P1Side

Measure = Callable[[Algorithm], dict[str, float]]


def measured_run(
    built: Built, *, every: int = 1, measure: Measure = global_grad_norms, evaluate: bool = True
) -> list[dict[str, Any]]:
    """Run ``built`` to its last round; a row at round 0 and every ``every`` rounds (and the last) with
    ``measure(algorithm)`` (default: ``grad_sq`` of a full-model algorithm), the round's metrics and,
    with ``evaluate``, the algorithm's evaluation."""
    algorithm, rounds = built.algorithm, built.config.rounds
    rows = [{"round": 0, **measure(algorithm), **(built.evaluate(0).row() if evaluate else {})}]
    for t in range(1, rounds + 1):
        metrics = built.round(t).row()
        if t % every == 0 or t == rounds:
            rows.append(
                {"round": t, **measure(algorithm), **metrics, **(built.evaluate(t).row() if evaluate else {})}
            )
    return rows


class P1Objective(nn.Module):
    """One side of P1 as a classifier: logits whose label-0 cross-entropy is ``F_i(w) + offset``."""

    def __init__(self, side: P1Side, start: np.ndarray):
        super().__init__()
        self.w = nn.Parameter(torch.as_tensor(start, dtype=torch.float32).clone())
        self.h = tuple(float(v) for v in side.h)  # constants, not buffers: nothing to send or average
        self.beta = side.beta
        self.sigma_L2 = side.sigma_L2
        self.offset = side.beta * side.d + 1.0

    def forward(self, centres: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(self.h, dtype=centres.dtype, device=centres.device)
        w = self.w
        z = 0.5 * (h * (w - centres) ** 2).sum(-1) + self.beta * torch.cos(w).sum() + self.offset
        if self.training and self.sigma_L2 > 0:
            batch, d = centres.shape
            noise = torch.randn_like(centres) * math.sqrt(batch * self.sigma_L2 / d)
            kick = (noise * w).sum(-1)
            z = z + (kick - kick.detach())
        v = z + torch.log(-torch.expm1(-z))
        return torch.stack([torch.zeros_like(v), v], dim=-1)


def p1_data(side: P1Side, samples_per_client: int, seed: int, device: torch.device) -> FederatedData:
    """Federated data of a P1 side: client i holds ``samples_per_client`` copies of its centre c_i."""
    centres = torch.as_tensor(side.centres, dtype=torch.float32)
    x_train = centres.repeat_interleave(samples_per_client, dim=0)
    dataset = Dataset(
        name="p1",
        x_train=x_train,
        y_train=torch.zeros(len(x_train), dtype=torch.int64),
        x_test=centres.clone(),
        y_test=torch.zeros(side.m, dtype=torch.int64),
        num_classes=2,
    )
    train = [np.arange(i * samples_per_client, (i + 1) * samples_per_client) for i in range(side.m)]
    test = [np.array([i]) for i in range(side.m)]
    return FederatedData(dataset, train, test, seed, device)


def p1_built(side: P1Side, start: np.ndarray, config: RunConfig, samples_per_client: int) -> Built:
    """``config``'s algorithm built on one P1 side instead of ``config.data`` / ``config.model``.

    ``config.partition.num_clients`` must equal the side's m; ``rounds``, ``seed``, ``engine`` and the
    algorithm block are used as given. Choose ``samples_per_client`` as a multiple of the batch size
    (K * B for K local steps of one epoch), so no batch is short.
    """
    if config.partition.num_clients != side.m:
        raise ConfigError("partition.num_clients", f"must equal the P1 problem's m = {side.m}")
    device = torch.device(config.engine.device)
    data = p1_data(side, samples_per_client, config.seed, device)

    def build() -> SplitModel:
        return SplitModel(OrderedDict(p1=P1Objective(side, start)), name="p1")

    ctx = context(config, data, build, device)
    return Built(config, ctx, ALGORITHMS[config.algorithm.name](ctx, config.algorithm))


def context(
    config: RunConfig, data: FederatedData, build_model: Callable[[], SplitModel], device: torch.device
) -> Context:
    """The build context of an algorithm on data and a model the runner did not make (the only place
    here that knows :class:`~fedge.algorithms.Context`'s fields)."""
    return Context(
        config=config,
        data=data,
        build_model=build_model,
        executor=make_executor(executor_name(config, device.type), fused=config.engine.fused),
        network=Network(Ledger(), config.seed),
        system=SystemModel(config.system, data.num_clients, config.seed),
        device=device,
        seed=config.seed,
    )


def p1_iterate(algorithm: Algorithm) -> np.ndarray:
    """The global P1 iterate w held by ``algorithm`` (its state's ``params['p1.w']``)."""
    state = algorithm.state_dict()
    params = state["bank"]["params"] if "bank" in state else state.get("params", {})
    if "p1.w" not in params:
        raise TypeError(f"{type(algorithm).__name__} keeps no global 'params' with the P1 vector")
    w = params["p1.w"].detach().double().cpu().numpy()
    if w.ndim == 2 and w.shape[0] == 1:  # a bank of one learner (centralized)
        w = w[0]
    if w.ndim != 1:
        raise TypeError(f"{type(algorithm).__name__} holds P1 vectors of shape {w.shape}, not one global one")
    return w


def p1_trace(built: Built, side: P1Side) -> np.ndarray:
    """``||grad F(w_t)||^2`` of the P1 side at t = 0 (start) and after each of ``config.rounds`` rounds."""
    algorithm = built.algorithm
    out = [float(side.grad_sq(p1_iterate(algorithm)))]
    for t in range(1, built.config.rounds + 1):
        built.round(t)
        out.append(float(side.grad_sq(p1_iterate(algorithm))))
    return np.array(out)
