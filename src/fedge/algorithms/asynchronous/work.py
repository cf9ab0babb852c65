"""A client's job in the straggler-aware and asynchronous variants: FedAvg's local training (DP-SGD in
every step under ``privacy.sample``), and what the job costs each client on the simulated clock
(download, compute, upload) given its device profile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from fedge.algorithms.asynchronous.config import LocalWorkConfig
from fedge.algorithms.base import Context
from fedge.comm import nodes
from fedge.comm.codecs import value_counts
from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine import (
    ClientBank,
    buffers_of,
    classification_loss,
    make_optimizer,
    make_step,
    parameters_of,
)
from fedge.engine.private_step import PrivateStep, private_step
from fedge.engine.step import LossFn
from fedge.errors import ConfigError
from fedge.system import forward_flops, training_flops
from fedge.system.jobs import JobPhases, job_phases, steps_within
from fedge.tensors import Tensors, floating


@dataclass(frozen=True)
class Trained:
    """A group of clients' trained models (stacked rows), their mean losses and samples processed."""

    clients: np.ndarray
    params: Tensors
    buffers: Tensors
    losses: torch.Tensor
    samples: np.ndarray


ANCHOR = "anchor::"  # buffer prefix of the model a proximal job started from


@dataclass(frozen=True)
class ProximalLoss:
    """FedAsync's regularised local objective (Xie et al., 2019, Algorithm 1): the weighted loss plus
    ``mu / 2 ||params - anchor||^2``, the anchor (the model the client received) riding in the buffers
    under :data:`ANCHOR` so that both executors carry it row by row."""

    loss: LossFn
    mu: float

    def __call__(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, Tensors]:
        loss, new = self.data(params, buffers, x, y, weight)
        return loss + self.penalty(params, buffers), new

    def data(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, Tensors]:
        """The weighted loss alone (the anchors kept in the new buffers): DP-SGD's clipped term."""
        anchors = {k: v for k, v in buffers.items() if k.startswith(ANCHOR)}
        loss, new = self.loss(params, {k: v for k, v in buffers.items() if k not in anchors}, x, y, weight)
        return loss, {**new, **anchors}

    def penalty(self, params: Tensors, buffers: Tensors) -> torch.Tensor:
        """The pull ``mu / 2 ||params - anchor||^2``, which depends on no sample."""
        pull = cast(torch.Tensor, sum(((params[k] - buffers[ANCHOR + k]) ** 2).sum() for k in params))
        return 0.5 * self.mu * pull


def cohort_size(num_clients: int, fraction: float) -> int:
    """``max(1, round(fraction * n))``, FedAvg's cohort."""
    return min(num_clients, max(1, round(fraction * num_clients)))


def truncated(plan: BatchPlan, steps: np.ndarray) -> BatchPlan:
    """``plan`` with row ``r`` stopped after ``steps[r]`` local steps (its later steps become padding)."""
    kept = np.minimum(plan.steps.cpu().numpy(), steps)
    alive = torch.arange(plan.num_steps)[None, :] < torch.as_tensor(kept)[:, None]
    weight = plan.weight * alive.to(plan.weight.device, plan.weight.dtype)[:, :, None]
    return BatchPlan(plan.clients, plan.index, weight, torch.as_tensor(kept, dtype=plan.steps.dtype))


class LocalWork:
    """FedAvg's client side (model, step, links) and the simulated cost of a job; with ``proximal_mu``
    > 0 the local objective is :class:`ProximalLoss` (FedAsync's), and with ``privacy.sample`` every
    local step is DP-SGD (:func:`~fedge.engine.private_step.private_step`; the proximal pull is not
    clipped, it depends on no sample)."""

    def __init__(self, ctx: Context, cfg: LocalWorkConfig, proximal_mu: float = 0.0):
        if ctx.cohorts.processes > 1:
            raise ConfigError("algorithm.name", f"{cfg.name} runs in one process (not across ranks)")
        self.ctx, self.cfg, self.proximal_mu = ctx, cfg, proximal_mu
        self.model = ctx.build_model().to(ctx.device)
        self.params = parameters_of(self.model)
        self.buffers = buffers_of(self.model)
        self.sgd = make_optimizer(cfg.optimizer)
        loss: LossFn = classification_loss(self.model, ctx.criterion)
        plain = make_step(ProximalLoss(loss, proximal_mu) if proximal_mu else loss, self.sgd)
        self.step = private_step(plain, ctx.privacy, self.model)
        self.up, self.down = ctx.network.link(cfg.codec_up), ctx.network.link(cfg.codec_down)
        self.flops_per_sample = forward_flops(self.model, ctx.data.input_shape)
        model = {**self.params, **floating(self.buffers)}  # what travels each way: one model
        self.up_bits = float(self.up.codec.bits(value_counts(model, False))[0])
        self.down_bits = float(self.down.codec.bits(value_counts(model, False))[0])
        self.model_values = sum(t.numel() for t in model.values())

    def send(self, t: int, clients: np.ndarray, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        """The server sends the model to ``clients`` in round ``t``; what they decode."""
        down = self.down.send(
            t, nodes.SERVER, nodes.clients(clients), "model_down", {**params, **floating(buffers)}
        )
        return {k: down.payload[k] for k in params}, {k: down.payload.get(k, v) for k, v in buffers.items()}

    def plan(self, clients: np.ndarray, key: int, data: FederatedData | None = None) -> BatchPlan:
        """The local steps of ``clients`` for a job keyed ``key`` (FedAvg's round), over ``data`` (default:
        the run's; a backdoor's view, whose malicious clients index their stamped copies)."""
        cfg = self.cfg
        data = self.ctx.data if data is None else data
        return data.batch_plan(clients, key, cfg.local_epochs, cfg.batch_size, cfg.drop_last)

    def train(
        self,
        plan: BatchPlan,
        params: Tensors,
        buffers: Tensors,
        job: tuple[int, ...] | None = None,
        data: FederatedData | None = None,
    ) -> Trained:
        """Every client of ``plan`` trains from ``params`` / ``buffers`` with a fresh optimizer state (with
        ``proximal_mu``, on an objective that pulls it back towards ``params``, the model it received), on
        ``data`` (default: the run's; an adversary's label view).
        Under DP-SGD the steps actually in ``plan`` are released in the current round, their noise keyed
        by ``job`` (an asynchronous dispatch's key; None: the round's training call, a synchronous round)."""
        clients = np.asarray(plan.clients, dtype=np.int64)
        anchors = {ANCHOR + k: v for k, v in params.items()} if self.proximal_mu else {}
        bank = ClientBank.broadcast(clients, params, {**buffers, **anchors}, self.sgd.init(params))
        self.model.train()
        step = self.step.for_job(job) if isinstance(self.step, PrivateStep) and job is not None else self.step
        data = self.ctx.data if data is None else data
        losses = self.ctx.executor.train(step, bank, plan, data, self.cfg.optimizer.lr)
        samples = plan.weight.sum(dim=(1, 2)).cpu().numpy().astype(np.float64)
        trained = {k: v for k, v in bank.buffers.items() if k not in anchors}
        return Trained(clients, bank.params, trained, losses, samples)

    def phases(self, t: int, clients: np.ndarray, samples: np.ndarray) -> JobPhases:
        """What each of ``clients``' jobs costs: receiving the model, training on ``samples`` samples,
        uploading its model, on its own device and links (fading of round ``t``)."""
        flops = training_flops(self.flops_per_sample, samples)
        return job_phases(self.ctx.system, t, clients, flops, self.down_bits, self.up_bits)

    def steps_within(self, plan: BatchPlan, seconds: np.ndarray) -> np.ndarray:
        """How many local steps of each row of ``plan`` its client completes in ``seconds`` of compute."""
        per_step = plan.weight.sum(dim=2).cpu().numpy().astype(np.float64)  # samples of each step
        clients = np.asarray(plan.clients, dtype=np.int64)
        return steps_within(self.ctx.system, clients, per_step, self.flops_per_sample, seconds)
