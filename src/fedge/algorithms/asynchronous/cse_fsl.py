"""Asynchronous CSE-FSL on the simulated clock (docs/async.md): aux-head clients upload their smashed data
when they are ready, the one shared server model learns from the uploads in the order they arrive, and
the client models are merged every ``buffer_size`` arrivals, FedBuff-style.

CSE-FSL's parts do the work: the client side, the shared server, the local steps and the upload steps
(:class:`~fedge.algorithms.split.cse_fsl.CseFsl`), the arrival timeline of ``server_order: arrival``
(:mod:`~fedge.algorithms.split.order`), the broadcast, upload and average of the client models
(:mod:`~fedge.algorithms.split.client_model`); what is new is the event loop over
:class:`~fedge.system.events.EventQueue`.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import PositiveInt

from fedge.aggregation import Updates, sites
from fedge.algorithms.asynchronous.uploads import DeferredExchange, Upload
from fedge.algorithms.asynchronous.work import draw_clients, idle_online
from fedge.algorithms.base import Context, register
from fedge.algorithms.split.cost import client_flops
from fedge.algorithms.split.cse_fsl import CseFsl, CseFslConfig
from fedge.algorithms.split.participation import Draws, aggregation_weights
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.tally import Tally
from fedge.comm import nodes
from fedge.comm.codecs import nonzero_counts, value_counts
from fedge.engine import ClientBank
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.system import SplitWork, split_round, training_flops
from fedge.system.arrivals import merge_path
from fedge.system.clock import RoundCost
from fedge.system.events import EventQueue, Job
from fedge.tensors import Tensors, floating

EVENT_STATE = (
    "version",
    "now",
    "server_free",
    "server_steps",
    "draws",
    "refills",
    "queue",
    "flight",
    "arrived",
)
SMASHED, MODEL = "smashed", "model"  # the two kinds of event: a smashed-data upload, a client model


class CseFslAsyncConfig(CseFslConfig):
    """Asynchronous CSE-FSL: CSE-FSL's knobs, the uploads served in arrival order, and how the client
    models are merged."""

    name: Literal["cse_fsl_async"] = "cse_fsl_async"  # type: ignore[assignment]
    """the algorithm (`fedge list`)"""
    server_order: Literal["round_robin", "random", "client_after_client", "arrival"] = "arrival"
    """the shared server serves uploads in the order they arrive (the only order here)"""
    buffer_size: PositiveInt | None = None
    """client models per merge, K (none: the clients at work, so K = the cohort)"""
    staleness: Literal["sqrt", "none"] = "sqrt"
    """a client model tau versions old moves the global one by 1/sqrt(1 + tau) of its weight, or fully"""


def refused(cfg: CseFslAsyncConfig) -> tuple[str, str] | None:
    """The first setting asynchronous CSE-FSL cannot run, as (key, reason)."""
    checks = (
        ("server_order", cfg.server_order != "arrival", "the asynchronous server serves in arrival order"),
        ("server_trigger", cfg.server_trigger != "every_h_batches", "the server learns from each upload"),
        ("agg_every", cfg.agg_every is not None, "client models are merged every buffer_size arrivals"),
        ("participation", cfg.participation == "with_replacement", "a client is at work once at a time"),
        ("aggregate_aux", not cfg.aggregate_aux, "the aux heads are merged with the trunks"),
        ("arrival_jitter_s", cfg.arrival_jitter_s > 0, "arrivals are the clients' own device times"),
    )
    return next(((key, reason) for key, bad, reason in checks if bad), None)


@register(
    "cse_fsl_async",
    CseFslAsyncConfig,
    "Asynchronous CSE-FSL: smashed data served in arrival order, client models merged every K arrivals",
)
class CseFslAsync(CseFsl):
    """CSE-FSL whose clients work on their own simulated time.

    The server keeps ``clients_per_round`` clients (all with full participation) at work. Dispatching a
    group sends it the global client model (version ``v``: merges so far); each client runs CSE-FSL's
    local steps and its every-h uploads and, at the end, uploads its client model. Every upload is an
    event at the time it reaches the server on the client's own device and links. The shared server
    takes one SGD step per smashed-data upload in event order; one runner round is one merge of
    ``buffer_size`` client models: ``x += global_lr * sum_k w_k s(tau_k) (x_k - x_{v_k})``, the plain
    weighted average (CSE-FSL's, computed as it computes it) when every model is fresh.
    """

    cfg: CseFslAsyncConfig
    exchange_class = DeferredExchange  # uploads placed on the arrival timeline, served in event order

    def __init__(self, ctx: Context, cfg: CseFslAsyncConfig):
        problem = refused(cfg)
        if problem is not None:
            raise ConfigError(f"algorithm.{problem[0]}", f"{cfg.name}: {problem[1]}")
        if ctx.cohorts.processes > 1:
            raise ConfigError("algorithm.name", f"{cfg.name} runs in one process (not across ranks)")
        super().__init__(ctx, cfg)
        self.concurrency = self.rows_per_round
        self.buffer_size = cfg.buffer_size or self.concurrency
        if self.buffer_size > self.concurrency:
            raise ConfigError(
                "algorithm.buffer_size",
                f"{self.buffer_size} client models per merge, but only {self.concurrency} clients at work",
            )
        self.version = 0  # merges of the client model so far
        self.now = 0.0  # the server's simulated time
        self.server_free = 0.0  # when the shared server is done with the uploads it took
        self.server_steps = 0  # the server model's steps so far
        self.draws = 0  # availability draws so far (one per dispatch)
        self.refills = 0  # dispatches at the current version
        self.queue = EventQueue()
        self.flight: dict[int, dict[str, Any]] = {}  # by event seq: the upload or the client model
        self.arrived: list[dict[str, Any]] = []  # client models received, not merged yet
        self.state_fields = (*self.state_fields, *EVENT_STATE)

    # --- dispatch -------------------------------------------------------------------------------------

    def _draws(self, clients: np.ndarray) -> tuple[Draws, torch.Tensor]:
        """``clients`` as the rows of a split round, one draw each, and their aggregation weights."""
        count, data, cfg = len(clients), self.ctx.data, self.cfg
        draws = Draws(clients, np.zeros(count, dtype=np.int64), np.ones(count, dtype=np.int64))
        sizes = data.client_sizes(clients)
        return draws, aggregation_weights(
            draws, sizes, cfg.aggregation, cfg.aggregate_divisor, data.num_clients
        )

    def _at_work(self) -> set[int]:
        """Clients whose client model has not arrived yet."""
        return {event["client"] for event in self.flight.values() if event["kind"] == MODEL}

    def refill(self, t: int) -> None:
        """Dispatch the global client model to as many idle online clients as there are free places."""
        working = self._at_work()
        free = self.concurrency - len(working)
        if free <= 0:
            return
        self.draws += 1
        pool = idle_online(self.ctx.system, self.draws, working | {u["client"] for u in self.arrived})
        keys = (self.version + 1,) if self.refills == 0 else (self.version + 1, self.refills)
        clients = draw_clients(self.ctx.seed, pool, free, *keys)
        if len(clients):
            self.refills += 1
            self.dispatch(t, clients)

    def dispatch(self, t: int, clients: np.ndarray) -> None:
        """The group ``clients`` receives the client model in round ``t`` and runs its local steps; its
        uploads and client models become events, and the energy of the whole job is charged now."""
        ctx = self.ctx
        rnd = self.start(t, *self._draws(clients))
        received = {k: v[0].clone() for k, v in rnd.rows.params.items()}  # the model the group got
        self.local_steps(rnd, self.plan(rnd), None)
        self.client_opt.end(rnd.draws.clients, rnd.rows.opt_state, rnd.cohort)
        for upload in self.exchange.take():
            self._push(upload.arrival, int(clients[upload.row]), SMASHED, self._smashed(upload))
        tally, timeline, system = rnd.tally, rnd.timeline, ctx.system
        model_bits = self._model_bits(rnd.rows)
        rest = client_flops(self.flops, tally.client_samples - timeline.computed)
        ready = (
            timeline.ready
            + system.client_compute(rest, clients).seconds
            + system.upload(clients, model_bits, t).seconds
        )
        computed = client_flops(self.flops, tally.client_samples)
        server = training_flops(self.flops.server, tally.server_samples)
        work = SplitWork(clients, tally.up_bits + model_bits, tally.down_bits, computed, server)
        job = split_round(system, t, work, shared=True)
        ctx.system.charge(RoundCost(0.0, job.joules, {}, job.joules_by_node))
        phases = (
            system.download(clients, tally.down_bits, t).seconds,
            system.client_compute(work.client_flops, clients).seconds,
            system.upload(clients, work.up_bits, t).seconds,
        )
        losses = (tally.loss_sum / tally.loss_steps.clamp_min(1)).double().cpu()
        for row, client in enumerate(clients.tolist()):
            model = {
                "params": {k: v[row].clone() for k, v in rnd.rows.params.items()},
                "buffers": {k: v[row].clone() for k, v in rnd.rows.buffers.items()},
                "base": received,  # the global client model as the group received it (one, shared)
                "loss": float(losses[row]),
                "seconds": [float(p[row]) for p in phases],
            }
            self._push(float(ready[row]), client, MODEL, model)

    def _smashed(self, upload: Upload) -> dict[str, Any]:
        """An upload as a checkpointable event."""
        synced = self.server_steps  # the server model's steps when the client got its model
        return {"z": upload.z, "y": upload.y, "count": upload.count, "key": upload.key, "synced": synced}

    def _push(self, after: float, client: int, kind: str, event: dict[str, Any]) -> None:
        """An event ``after`` seconds from now, of ``client`` at the current version."""
        job = self.queue.push(self.now + after, client, self.version, self.now)
        self.flight[job.seq] = {"kind": kind, "client": client, **event}

    def _model_bits(self, bank: ClientBank) -> np.ndarray:
        """The bits each row's client-model upload carries (the parts that travel, in the up codec)."""
        codec, bits = self.models.up.codec, np.zeros(len(bank.clients))
        for _, part in self.models.parts():
            sent = {**part(bank.params), **floating(part(bank.buffers))}
            if sent:
                nonzeros = nonzero_counts(sent, True) if codec.counts_nonzeros else None
                bits += codec.bits(value_counts(sent, True), nonzeros)
        return bits

    # --- events ---------------------------------------------------------------------------------------

    def _serve(self, t: int, job: Job, event: dict[str, Any], figures: dict[str, list[float]]) -> None:
        """The shared server takes one step on an arrived upload, once it is free."""
        batch = Upload(0, job.time, event["z"], event["y"], event["count"], event["key"]).batch()
        served = self.server.serve(batch, self.learning_rates(t)[1], False, [0])
        began = max(self.server_free, job.time)
        self.server_free = began + float(self.exchange.order.service(np.array([float(event["count"])]))[0])
        figures["loss"].append(float(served.loss.sum()))
        figures["staleness"].append(self.version - job.version)
        figures["lag"].append(self.server_steps - event["synced"])
        figures["wait"].append(began - job.time)
        self.server_steps += 1

    def run_round(self, t: int) -> RoundReport:
        began = self.now
        figures: dict[str, list[float]] = {"loss": [], "staleness": [], "lag": [], "wait": []}
        self.refill(t)
        while len(self.arrived) < self.buffer_size:
            if not len(self.queue):  # nobody at work and nobody could be dispatched
                if self.arrived:
                    break
                return self._report(t, [], figures, None)
            job = self.queue.pop()
            self.now = max(self.now, job.time)
            event = self.flight.pop(job.seq)
            if event["kind"] == SMASHED:
                self._serve(t, job, event, figures)
                continue
            self.arrived.append(
                {**event, "seq": job.seq, "version": job.version, "start": job.start, "time": job.time}
            )
            instant = len(self.queue) and self.queue.peek().time == job.time
            if len(self.arrived) < self.buffer_size and not instant:
                self.refill(t)  # the freed places, once every arrival of this instant is in
        updates = sorted(self.arrived, key=lambda u: u["seq"])
        self.arrived = []
        weights = self._merge(t, updates)
        closing = max(updates, key=lambda u: (u["time"], u["seq"]))  # the client model that closed it
        self.now = max(self.now, self.server_free)  # the merge waits for the server's backlog
        cost = merge_path(began, self.now, closing["start"], closing["time"], closing["seconds"])
        self.ctx.system.charge(cost)
        return self._report(t, updates, figures, weights)

    def _merge(self, t: int, updates: list[dict[str, Any]]) -> torch.Tensor:
        """Upload the arrived client models in round ``t`` and merge them into the global one; their
        aggregation weights."""
        ctx = self.ctx
        clients = np.array([u["client"] for u in updates], dtype=np.int64)
        draws, weights = self._draws(clients)
        bank = ClientBank(tuple(clients.tolist()), {})
        stack = {name: {k: torch.stack([u[name][k] for u in updates]) for k in updates[0][name]}
                 for name in ("params", "buffers")}  # fmt: skip
        bank.adopt(stack["params"], stack["buffers"], {}, owned=False)
        rnd = Round(
            t, draws, nodes.clients(clients), weights.to(ctx.device), *self.learning_rates(t), bank, None,
            Tally.zeros(len(clients), ctx.device), ctx.cohorts.whole(len(clients)),
        )  # fmt: skip
        uploaded = self.models.upload(rnd)
        stale = np.array([self.version - u["version"] for u in updates], dtype=np.float64)
        if not stale.any():
            self.client = self.models.average(rnd, uploaded, self.client, self.local_aux)
        else:
            self.client = self._stale_merge(rnd, uploaded, updates, stale)
        self.version += 1
        self.refills = 0
        self.hold_storage(len(clients), rnd.nodes)
        return rnd.weights.cpu()

    def _stale_merge(
        self, rnd: Round, uploaded: Tensors, updates: list[dict[str, Any]], stale: np.ndarray
    ) -> dict[str, Tensors]:
        """FedBuff's step on the client models' changes, each weighted by its share and staleness; the
        buffers (running statistics) are the weighted average of the arrived ones."""
        decay = 1.0 / np.sqrt(1.0 + stale) if self.cfg.staleness == "sqrt" else np.ones(len(stale))
        scale = rnd.weights * torch.as_tensor(decay, device=rnd.weights.device)
        params = {k: uploaded.get(k, v) for k, v in rnd.rows.params.items()}
        delta = {k: v - torch.stack([u["base"][k] for u in updates]) for k, v in params.items()}
        old, lr = self.client["params"], self.cfg.global_lr
        buffer = self.ctx.pipeline(sites.BUFFER)
        step = buffer.reduce(Updates.of_deltas(sites.BUFFER, rnd.t, delta, scale))
        buffers = {k: uploaded.get(k, v) for k, v in rnd.rows.buffers.items()}
        statistics = Updates.of(sites.BUFFER, rnd.t, buffers, rnd.weights, self.client["buffers"])
        return {"params": {k: old[k] + lr * step[k] for k in old}, "buffers": buffer.reduce(statistics)}

    # --- the clock and the report ---------------------------------------------------------------------

    def _report(
        self,
        t: int,
        updates: list[dict[str, Any]],
        figures: dict[str, list[float]],
        weights: torch.Tensor | None,
    ) -> RoundReport:
        """The round's figures: the client models merged (with their aggregation ``weights``), the uploads
        served and their staleness; its training loss is the merged clients' mean, weighted like the
        merge (CSE-FSL's)."""
        served = len(figures["loss"])
        self.totals["uploads"] += served
        self.totals["server_steps"] += served
        stale = figures["staleness"] or [0]
        model_stale = [self.version - 1 - u["version"] for u in updates] or [0]
        report = {
            "server_loss": sum(figures["loss"]) / max(served, 1),
            "participants": len(updates),
            "uploads": served,
            "uploads_total": self.totals["uploads"],
            "server_steps_total": self.totals["server_steps"],
            "lr": self.learning_rates(t)[0],
            "queue_wait_s": float(sum(figures["wait"])),
            "staleness_mean": float(np.mean(stale)),
            "staleness_max": int(max(stale)),
            "server_lag_mean": float(np.mean(figures["lag"] or [0])),
            "model_staleness_max": int(max(model_stale)),
            "model_version": self.version,
            "in_flight": len(self._at_work()),
        }
        if weights is None:
            return RoundReport(0.0, report)
        losses = torch.tensor([u["loss"] for u in updates], dtype=torch.float64)
        return RoundReport(float((losses * weights / weights.sum()).sum()), report)
