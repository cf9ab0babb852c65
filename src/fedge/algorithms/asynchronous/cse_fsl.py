"""Asynchronous CSE-FSL on the simulated clock (docs/async.md): aux-head clients upload their smashed data
when they are ready, the one shared server model learns from the uploads in the order they arrive, and
the client models are merged every ``buffer_size`` arrivals, FedBuff-style.

CSE-FSL's parts do the work: the client side, the shared server, the local steps and the upload steps
(:class:`~fedge.algorithms.split.cse_fsl.CseFsl`), the arrival timeline of ``server_order: arrival``
(:mod:`~fedge.algorithms.split.order`), the broadcast, upload and average of the client models
(:mod:`~fedge.algorithms.split.client_model`); the event loop is
:class:`~fedge.runtime.asynchronous.AsyncEngine`'s, and this module is its policy: what a dispatched
group does, how the shared server serves an upload, and how the client models are merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import PositiveInt

from fedge.aggregation import Updates, sites
from fedge.algorithms.asynchronous.uploads import DeferredExchange, Upload
from fedge.algorithms.base import Context, register
from fedge.algorithms.split.cost import client_flops
from fedge.algorithms.split.cse_fsl import CseFsl, CseFslConfig
from fedge.algorithms.split.participation import Draws, aggregation_weights
from fedge.algorithms.split.round import Round
from fedge.comm import nodes
from fedge.comm.codecs import nonzero_counts, value_counts
from fedge.engine import ClientBank
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.runtime.asynchronous import Arrival, AsyncEngine, Dispatch, Dispatched, Event
from fedge.system import SplitWork, training_flops
from fedge.system.arrivals import split_jobs
from fedge.tensors import Tensors, floating


@dataclass(frozen=True)
class Smashed:
    """A smashed-data upload in flight: the row's cut activations and labels (the first ``count`` real),
    its noise key, and the server model's steps when its client received the client model."""

    z: torch.Tensor
    y: torch.Tensor
    count: int
    key: torch.Tensor | None
    synced: int


@dataclass(frozen=True)
class ClientModel:
    """A client model in flight: its parameters and buffers, the global client model its group received
    (one, shared) and the client's mean training loss."""

    params: Tensors
    buffers: Tensors
    base: Tensors
    loss: float


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
    recorded = frozenset()  # its uploads are served on the arrival timeline, not through the recorder
    exchange: DeferredExchange
    exchange_class = DeferredExchange  # uploads placed on the arrival timeline, served in event order
    state_fields = (*CseFsl.state_fields, "server_free_at", "server_steps", "engine")

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
        self.server_free_at = 0.0  # when the shared server is done with the uploads it took
        self.server_steps = 0  # the server model's steps so far
        self.figures: dict[str, list[float]] = {}  # the round's served uploads: loss, staleness, lag, wait
        self.engine = AsyncEngine(ctx, self, (Smashed, ClientModel))

    @property
    def version(self) -> int:
        """Merges of the client model so far."""
        return self.engine.version

    def stored(self) -> None:
        return None  # the split family's storage (hold_storage)

    def server_free(self) -> float:
        return self.server_free_at

    def due(self, arrived: int) -> bool:
        return arrived >= self.buffer_size

    # --- dispatch -------------------------------------------------------------------------------------

    def _draws(self, clients: np.ndarray) -> tuple[Draws, torch.Tensor]:
        """``clients`` as the rows of a split round, one draw each, and their aggregation weights."""
        count, data, cfg = len(clients), self.ctx.data, self.cfg
        draws = Draws(clients, np.zeros(count, dtype=np.int64), np.ones(count, dtype=np.int64))
        sizes = data.client_sizes(clients)
        return draws, aggregation_weights(
            draws, sizes, cfg.aggregation, cfg.aggregate_divisor, data.num_clients
        )

    def dispatch(self, t: int, clients: np.ndarray, version: int) -> Dispatched:
        """The group ``clients`` receives the client model in round ``t`` and runs its local steps: its
        uploads and its client models, and the energy of the whole job (charged at once)."""
        rnd = self.start(t, *self._draws(clients))
        received = {k: v[0].clone() for k, v in rnd.rows.params.items()}  # the model the group got
        plan = self.plan(rnd)
        self.record_cut(rnd, plan)  # privacy.cut / labels: the dispatch's sends, recorded in round t
        self.local_steps(rnd, plan, None)
        self.client_opt.end(rnd.draws.clients, rnd.rows.opt_state, rnd.cohort)
        messages = [
            Dispatch(int(clients[upload.row]), upload.arrival, self._smashed(upload), final=False)
            for upload in self.exchange.take()
        ]
        tally, timeline = rnd.tally, rnd.timeline
        assert timeline is not None  # server_order: arrival keeps one
        model_bits = self._model_bits(rnd.rows)
        rest = client_flops(self.flops, tally.client_samples - timeline.computed)
        computed = client_flops(self.flops, tally.client_samples)
        server = training_flops(self.flops.server, tally.server_samples)
        work = SplitWork(clients, tally.up_bits + model_bits, tally.down_bits, computed, server)
        jobs = split_jobs(self.ctx.system, t, work, timeline.ready, rest, model_bits)
        losses = (tally.loss_sum / tally.loss_steps.clamp_min(1)).double().cpu()
        for row, client in enumerate(clients.tolist()):
            model = ClientModel(
                {k: v[row].clone() for k, v in rnd.rows.params.items()},
                {k: v[row].clone() for k, v in rnd.rows.buffers.items()},
                received,
                float(losses[row]),
            )
            seconds = tuple(float(p[row]) for p in jobs.seconds)
            messages.append(Dispatch(client, float(jobs.arrival[row]), model, seconds=seconds))
        return Dispatched(messages, jobs.energy)

    def _smashed(self, upload: Upload) -> Smashed:
        """An upload as it waits in flight."""
        return Smashed(upload.z, upload.y, upload.count, upload.key, self.server_steps)

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

    def serve(self, t: int, event: Event) -> None:
        """The shared server takes one step on an arrived upload, once it is free."""
        smashed: Smashed = event.message.payload
        batch = Upload(0, event.time, smashed.z, smashed.y, smashed.count, smashed.key).batch()
        served = self.server.serve(batch, self.learning_rates(t)[1], False, [0])
        began = max(self.server_free_at, event.time)
        service = self.exchange.order.service(np.array([float(smashed.count)]))
        self.server_free_at = began + float(service[0])
        figures = self.figures
        figures["loss"].append(float(served.loss.sum()))
        figures["staleness"].append(self.version - event.version)
        figures["lag"].append(self.server_steps - smashed.synced)
        figures["wait"].append(began - event.time)
        self.server_steps += 1

    def run_round(self, t: int) -> RoundReport:
        self.figures = {"loss": [], "staleness": [], "lag": [], "wait": []}
        arrivals = self.engine.run_round(t)
        return self._report(t, arrivals)

    def aggregate(self, t: int, arrivals: list[Arrival]) -> None:
        """Upload the arrived client models in round ``t`` and merge them into the global one."""
        ctx = self.ctx
        clients = np.array([a.client for a in arrivals], dtype=np.int64)
        draws, weights = self._draws(clients)
        cohort = self.runtime.whole(len(clients))
        bank = self.runtime.bank(cohort, clients)
        models: list[ClientModel] = [a.payload for a in arrivals]
        bank.adopt(
            {k: torch.stack([m.params[k] for m in models]) for k in models[0].params},
            {k: torch.stack([m.buffers[k] for m in models]) for k in models[0].buffers},
            {},
            owned=False,
        )
        rnd = Round.trained(t, draws, nodes.clients(clients), weights.to(ctx.device), self.learning_rates(t),
                            bank, cohort)  # fmt: skip
        uploaded = self.models.upload(rnd)
        stale = np.array([self.version - a.version for a in arrivals], dtype=np.float64)
        if not stale.any():
            self.client = self.models.average(rnd, uploaded, self.client, self.local_aux)
        else:
            self.client = self._stale_merge(rnd, uploaded, models, stale)
        self.hold_storage(len(clients), rnd.nodes)

    def _stale_merge(
        self, rnd: Round, uploaded: Tensors, models: list[ClientModel], stale: np.ndarray
    ) -> dict[str, Tensors]:
        """FedBuff's step on the client models' changes, each weighted by its share and staleness; the
        buffers (running statistics) are the weighted average of the arrived ones."""
        decay = 1.0 / np.sqrt(1.0 + stale) if self.cfg.staleness == "sqrt" else np.ones(len(stale))
        scale = rnd.weights * torch.as_tensor(decay, device=rnd.weights.device)
        params = {k: uploaded.get(k, v) for k, v in rnd.rows.params.items()}
        delta = {k: v - torch.stack([m.base[k] for m in models]) for k, v in params.items()}
        old, lr = self.client["params"], self.cfg.global_lr
        buffer = self.ctx.pipeline(sites.BUFFER)
        step = buffer.reduce(Updates.of_deltas(sites.BUFFER, rnd.t, delta, scale))
        buffers = {k: uploaded.get(k, v) for k, v in rnd.rows.buffers.items()}
        statistics = Updates.of(sites.BUFFER, rnd.t, buffers, rnd.weights, self.client["buffers"])
        return {"params": {k: old[k] + lr * step[k] for k in old}, "buffers": buffer.reduce(statistics)}

    # --- the report -----------------------------------------------------------------------------------

    def _report(self, t: int, arrivals: list[Arrival]) -> RoundReport:
        """The round's figures: the client models merged, the uploads served and their staleness; its
        training loss is the merged clients' mean, weighted like the merge (CSE-FSL's)."""
        figures = self.figures
        served = len(figures["loss"])
        self.totals["uploads"] += served
        self.totals["server_steps"] += served
        stale = figures["staleness"] or [0]
        model_stale = [self.version - 1 - a.version for a in arrivals] or [0]
        report = {
            "server_loss": sum(figures["loss"]) / max(served, 1),
            "participants": len(arrivals),
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
            "in_flight": self.engine.in_flight,
        }
        if not arrivals:
            return RoundReport(0.0, report)
        weights = self._draws(np.array([a.client for a in arrivals], dtype=np.int64))[1].cpu()
        losses = torch.tensor([a.payload.loss for a in arrivals], dtype=torch.float64)
        return RoundReport(float((losses * weights / weights.sum()).sum()), report)
