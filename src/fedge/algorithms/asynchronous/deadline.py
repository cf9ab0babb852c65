"""Synchronous FedAvg that knows about stragglers: a round deadline, over-selection and
availability-aware sampling, on the clients' own device profiles (docs/async.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from fedge.aggregation import Updates, sites
from fedge.algorithms.asynchronous.config import DeadlineConfig
from fedge.algorithms.asynchronous.work import LocalWork, cohort_size, truncated
from fedge.algorithms.base import Context, GlobalModel, register
from fedge.comm import nodes
from fedge.data.federated import BatchPlan
from fedge.metrics import Evaluation, RoundReport
from fedge.runtime.adversary import Adversary
from fedge.runtime.availability import draw_clients
from fedge.runtime.deadline import DeadlineRuntime
from fedge.system.deadline import compute_left, cutoff
from fedge.tensors import floating


@register(
    "fedavg_deadline",
    DeadlineConfig,
    "FedAvg with a round deadline, over-selection and availability-aware sampling (stragglers)",
)
class FedAvgDeadline(GlobalModel):
    """FedAvg whose server stops waiting.

    Each round the server selects ``ceil(cohort * (1 + over_select))`` clients (among those online, or
    among all with ``sampling: uniform``, offline ones then missing the round), sends them the model,
    and waits until the cohort's first arrivals are in or ``deadline_s`` has passed, whichever is first.
    Every client's job lasts its download, its local training and its upload on its own device and
    links. Clients that are not in by then are dropped (their upload stops at the round's end; the
    ledger counts the bits it carried as ``model_up_late``), or with ``late: partial`` upload the model
    after the local steps they finished in time (weighted by the share of their steps done). The model
    is the sample-weighted average of what arrived; without a deadline, over-selection or offline
    clients it is FedAvg's round exactly. An adversary's clients that made the deadline (a partial one
    included) poison their rows after the server received them and before its pipeline, as at the star
    server (:class:`~fedge.runtime.adversary.Adversary` over the round's received rows).
    """

    state_fields = ("params", "buffers")

    def __init__(self, ctx: Context, cfg: DeadlineConfig):
        super().__init__(ctx, cfg)
        self.work = LocalWork(ctx, cfg)
        self.model, self.params, self.buffers = self.work.model, self.work.params, self.work.buffers
        self.cohort = cohort_size(ctx.data.num_clients, cfg.fraction)
        self.runtime = DeadlineRuntime(ctx, self.work.up, {**self.params, **self.buffers})
        self.adversary = Adversary.of(ctx.config.adversary, ctx.data, ctx.seed, ctx.cohorts.processes)

    def select(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The clients selected in round ``t``, and which of them are online."""
        cfg, n = self.cfg, self.ctx.data.num_clients
        online = self.ctx.system.online(t)
        pool = np.flatnonzero(online) if cfg.sampling == "available" else np.arange(n)
        count = min(n, math.ceil(self.cohort * (1.0 + cfg.over_select) - 1e-9))
        chosen = draw_clients(self.ctx.seed, pool, count, t)
        return chosen, online[chosen]

    def run_round(self, t: int) -> RoundReport:
        cfg, ctx = self.cfg, self.ctx
        chosen, online = self.select(t)
        reached = chosen[online]
        figures: dict[str, Any] = {"selected": len(chosen), "offline": int((~online).sum())}
        if not len(reached):
            return RoundReport(0.0, {**figures, "participants": 0, "late": 0, "partial": 0})
        params, buffers = self.work.send(t, reached, self.params, self.buffers)
        data = None if self.adversary is None else self.adversary.data(t, ctx.data)
        plan = self.work.plan(reached, t, data)
        full = plan.weight.sum(dim=(1, 2)).cpu().numpy().astype(np.float64)
        phases = self.work.phases(t, reached, full)
        end, kept = cutoff(phases.seconds, reached, self.cohort, cfg.deadline_s)
        steps = plan.steps.cpu().numpy().copy()
        if cfg.late == "partial":  # the steps each late client finished with time left for its upload
            fits = self.work.steps_within(plan, compute_left(phases.each, end))
            steps = np.where(kept, steps, fits)
            kept |= steps > 0
        plan = truncated(plan, np.where(kept, steps, 0))
        done = plan.weight.sum(dim=(1, 2)).cpu().numpy().astype(np.float64)
        trainees = np.flatnonzero(kept)
        self.runtime.close(t, reached, phases.each, full, done, kept, end, self.work.model_values)
        if not len(trainees):
            figures.update(participants=0, late=len(reached), partial=0)
            return RoundReport(0.0, figures)  # nothing trained: the model stays as it was
        mine = truncated_rows(plan, trainees)
        trained = self.work.train(mine, params, buffers, data=data)
        received = reached[trainees]  # the clients that made the deadline (or sent their partial steps)
        senders = nodes.clients(received)
        model = {**trained.params, **floating(trained.buffers)}
        record = ctx.records_upload(sites.SERVER)
        up = self.work.up.send(t, senders, nodes.SERVER, "model_up", model, stacked=True, record=record)
        sizes = torch.as_tensor(ctx.data.client_sizes(received), dtype=torch.float64)
        share = torch.as_tensor(done[trainees] / full[trainees], dtype=torch.float64)
        sizes = sizes * share  # a partial client counts for the share of its steps it did
        weights = (sizes / sizes.sum()).to(ctx.device)
        stacked = {k: up.payload[k] for k in trained.params}
        stacked.update({k: up.payload.get(k, v) for k, v in trained.buffers.items()})
        reference, pipeline = {**params, **buffers}, ctx.pipeline(sites.SERVER)
        if self.adversary is not None:
            stacked = self.adversary.poison(t, received, stacked, reference)
        updates = Updates.of(sites.SERVER, t, stacked, weights, reference)
        averaged = pipeline.reduce(updates)
        if self.adversary is not None:
            figures.update(self.adversary.figures(t, received, weights, pipeline))
        self.params = {k: averaged[k] for k in self.params}
        self.buffers = {k: averaged[k] for k in self.buffers}
        self.runtime.store(senders, {**self.params, **self.buffers})
        train_loss = float((trained.losses.double().cpu() * weights.cpu()).sum())
        partial = int(np.sum(done[trainees] < full[trainees]))
        figures.update(participants=len(trainees), late=len(reached) - len(trainees), partial=partial)
        return RoundReport(train_loss, figures)

    def evaluate(self) -> Evaluation:
        """The server model's test figures, with a backdoor's attack success rate under one."""
        plain, adversary, ctx = super().evaluate(), self.adversary, self.ctx
        if adversary is None:
            return plain
        batch = ctx.config.eval.batch_size
        return plain.with_extra(**adversary.success(self.model, self.params, self.buffers, ctx.data, batch))


def truncated_rows(plan: BatchPlan, rows: np.ndarray) -> BatchPlan:
    """The rows ``rows`` of ``plan`` (the clients that train)."""
    index = torch.as_tensor(rows, device=plan.index.device)
    return BatchPlan(
        tuple(plan.clients[r] for r in rows),
        plan.index.index_select(0, index),
        plan.weight.index_select(0, index),
        plan.steps[torch.as_tensor(rows)],
    )
