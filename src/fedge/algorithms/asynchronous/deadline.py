"""Synchronous FedAvg that knows about stragglers: a round deadline, over-selection and
availability-aware sampling, on the clients' own device profiles (docs/async.md)."""

from __future__ import annotations

import math

import numpy as np
import torch

from fedge.aggregation import Updates, sites
from fedge.algorithms.asynchronous.config import DeadlineConfig
from fedge.algorithms.asynchronous.work import LocalWork, Phases, cohort_size, truncated
from fedge.algorithms.base import Context, GlobalModel, register
from fedge.comm import nodes
from fedge.data.federated import BatchPlan
from fedge.metrics import RoundReport
from fedge.runtime.availability import draw_clients
from fedge.system.clock import WAIT, RoundCost
from fedge.system.model import PhaseCost
from fedge.system.rounds import along, spent
from fedge.tensors import floating

LATE_KIND = "model_up_late"  # the part of a dropped client's upload sent before the round ended


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
    clients it is FedAvg's round exactly.
    """

    state_fields = ("params", "buffers")

    def __init__(self, ctx: Context, cfg: DeadlineConfig):
        super().__init__(ctx, cfg)
        self.work = LocalWork(ctx, cfg)
        self.model, self.params, self.buffers = self.work.model, self.work.params, self.work.buffers
        self.cohort = cohort_size(ctx.data.num_clients, cfg.fraction)
        ctx.network.hold(nodes.SERVER, "model", {**self.params, **self.buffers})

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
        figures = {"selected": len(chosen), "offline": int((~online).sum())}
        if not len(reached):
            return RoundReport(0.0, {**figures, "participants": 0, "late": 0, "partial": 0})
        params, buffers = self.work.send(t, reached, self.params, self.buffers)
        plan = self.work.plan(reached, t)
        full = plan.weight.sum(dim=(1, 2)).cpu().numpy().astype(np.float64)
        phases = self.work.phases(t, reached, full)
        finish = phases.seconds
        order = np.lexsort((reached, finish))  # arrival order, ties by client
        end = float(finish[order[min(self.cohort, len(reached)) - 1]])  # the cohort's last arrival
        if cfg.deadline_s is not None:
            end = min(end, cfg.deadline_s)
        kept = np.zeros(len(reached), dtype=bool)
        kept[order[: self.cohort]] = True
        kept &= finish <= end
        steps = plan.steps.cpu().numpy().copy()
        if cfg.late == "partial":  # the steps each late client finished with time left for its upload
            budget = end - phases.down.seconds - phases.up.seconds
            fits = self.work.steps_within(plan, np.maximum(budget, 0.0))
            steps = np.where(kept, steps, fits)
            kept |= steps > 0
        plan = truncated(plan, np.where(kept, steps, 0))
        done = plan.weight.sum(dim=(1, 2)).cpu().numpy().astype(np.float64)
        trainees = np.flatnonzero(kept)
        cost = self._cost(t, reached, phases, full, done, kept, end)
        ctx.system.charge(cost)
        if not len(trainees):
            figures.update(participants=0, late=len(reached), partial=0)
            return RoundReport(0.0, figures)  # nothing trained: the model stays as it was
        mine = truncated_rows(plan, trainees)
        trained = self.work.train(mine, params, buffers)
        senders = nodes.clients(reached[trainees])
        model = {**trained.params, **floating(trained.buffers)}
        up = self.work.up.send(t, senders, nodes.SERVER, "model_up", model, stacked=True)
        sizes = torch.as_tensor(ctx.data.client_sizes(reached[trainees]), dtype=torch.float64)
        share = torch.as_tensor(done[trainees] / full[trainees], dtype=torch.float64)
        sizes = sizes * share  # a partial client counts for the share of its steps it did
        weights = (sizes / sizes.sum()).to(ctx.device)
        stacked = {k: up.payload[k] for k in trained.params}
        stacked.update({k: up.payload.get(k, v) for k, v in trained.buffers.items()})
        updates = Updates.of(sites.SERVER, t, stacked, weights, {**params, **buffers})
        averaged = ctx.pipeline(sites.SERVER).reduce(updates)
        self.params = {k: averaged[k] for k in self.params}
        self.buffers = {k: averaged[k] for k in self.buffers}
        ctx.network.hold(senders, "model", {**self.params, **self.buffers})
        train_loss = float((trained.losses.double().cpu() * weights.cpu()).sum())
        partial = int(np.sum(done[trainees] < full[trainees]))
        figures.update(participants=len(trainees), late=len(reached) - len(trainees), partial=partial)
        return RoundReport(train_loss, figures)

    def _cost(
        self,
        t: int,
        clients: np.ndarray,
        phases: Phases,
        full: np.ndarray,
        done: np.ndarray,
        kept: np.ndarray,
        end: float,
    ) -> RoundCost:
        """The round's cost: it lasts until ``end``; a dropped client's job is cut there (its compute and
        its upload up to then, the upload's bits so far on the ledger as :data:`LATE_KIND`)."""
        down, compute, up = phases.down, phases.compute, phases.up
        computed = np.where(kept, done / np.maximum(full, 1.0), 0.0)
        dropped = ~kept
        cut = np.clip(end - down.seconds, 0.0, compute.seconds)
        computed[dropped] = cut[dropped] / np.maximum(compute.seconds[dropped], 1e-300)
        work = PhaseCost(compute.seconds * computed, compute.joules * computed, compute.phase, compute.payers)
        airtime = np.where(kept, up.seconds, np.clip(end - down.seconds - work.seconds, 0.0, up.seconds))
        sent = PhaseCost(airtime, up.joules * airtime / np.maximum(up.seconds, 1e-300), up.phase, up.payers)
        late = np.flatnonzero(dropped & (airtime > 0))
        if len(late):  # the values each late upload carried before the round ended, through the link
            values = self.work.model_values
            carried = np.floor(values * airtime[late] / up.seconds[late]).astype(np.int64)
            cut = {"model": torch.zeros(len(late), values, device=self.ctx.device)}
            self.work.up.send(
                t, nodes.clients(clients[late]), nodes.SERVER, LATE_KIND, cut, stacked=True, lengths=carried
            )
        ends = down.seconds + work.seconds + sent.seconds
        last = int(np.argmax(np.where(kept, ends, -1.0))) if kept.any() else int(np.argmax(ends))
        path = along(last, down, work, sent)
        gap = end - float(ends[last])
        if gap > 0:
            path[WAIT] = gap  # the server waiting for a deadline nobody else met
        return RoundCost(
            end,
            float(down.joules.sum() + work.joules.sum() + sent.joules.sum()),
            path,
            spent(down, work, sent),
        )


def truncated_rows(plan: BatchPlan, rows: np.ndarray) -> BatchPlan:
    """The rows ``rows`` of ``plan`` (the clients that train)."""
    index = torch.as_tensor(rows, device=plan.index.device)
    return BatchPlan(
        tuple(plan.clients[r] for r in rows),
        plan.index.index_select(0, index),
        plan.weight.index_select(0, index),
        plan.steps[torch.as_tensor(rows)],
    )
