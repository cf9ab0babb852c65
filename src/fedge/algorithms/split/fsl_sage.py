"""FSL-SAGE (Nair et al., ICML 2025): clients train on their aux model's estimate of the server's
cut-layer gradient; the server periodically aligns each aux model to its own gradients.

A round (the paper's client, federating-server and split-server algorithms, read with its public code):

1. The participants receive the averaged trunk; each keeps its own aux model (never averaged).
2. Local steps: the trunk steps on the gradient of the aux model's loss at the cut (the estimated
   smashed-activation gradient, :mod:`~fedge.algorithms.split.estimated`); the aux model does not move.
   One batch per block of ``h`` (the paper's Q, the code's ``server_update_interval``) sends its smashed
   data and labels to the server: by default the first of each block (local steps 0, h, 2h, ...; ceil(n/h)
   uploads of n batches, the code's ``local_iter % h == 0``), with ``upload_phase: last`` the last. The
   one server model takes an SGD step per upload (as CSE-FSL's server) and stores the sample for its
   client's alignment (the last ``align_samples`` samples per client, the code's ``max_dataset_size``).
   Nothing comes back during the local steps.
3. In every ``l``-th round (rounds 1, l + 1, 2l + 1, ...: the code's 0-based ``t % l == 0``) the server
   recomputes its cut-layer gradients of each participant's stored samples with its current model and
   fits that client's aux model to them (``align_epochs`` passes in batches of ``align_batch_size`` with
   ``aux_optimizer`` on the ``alignment_loss``: :mod:`~fedge.algorithms.split.alignment`), then sends the
   aligned aux model down (``aux_down``). With ``alignment_timing: after_local_steps`` (the default) it
   does so after the round's local steps, and the client trains with it from its next round; with
   ``first_batch`` (the code's) right after the server's step on the client's first upload of the round
   (its store then holds that batch), and the client's first batch already trains with it.
4. The trunks go up and are averaged (FedAvg); the server's one model needs no averaging.

Traffic per round and participant with n local batches of B samples, cut size d (values per sample),
trunk size |x_c| and aux size |x_a| (32-bit values): u * B * d smashed values and u * B labels up with
u = ceil(n / h) (``first``) or floor(n / h) (``last``), |x_c| down and |x_c| up, and |x_a| down in an
alignment round. The code counts the same but no labels (they are on their own ledger kind here).

Where paper and code differ, and our choices (docs/decisions.md, "FSL-SAGE"; the paper's algorithm lines
could not be read here, so neither default is the paper's word): the code aligns right after a client's
first upload of an alignment round, fedge by default after the round's local steps, so the aligned model
serves from the next round (and round 1 trains with the initial aux model); the code's alignment loss is
the summed squared difference of mean-loss gradients (``mean_loss_gradients``: one batch against the
whole store), fedge's default the per-sample mean (``per_sample_mean``), N times the code's when a batch
holds the whole store of N (its default); both switches together run the code's algorithm. The code runs
the server in training mode for the true gradients and keeps the buffer updates, we leave the server's
buffers untouched.

On the simulated clock an alignment round ends with the alignment: the server's compute on every
participant's store (phase ``align``, :func:`~fedge.algorithms.split.cost.alignment_flops`) and then
the aux models' downloads, after the round's own phases (:func:`~fedge.system.aligned_round`), under
either timing (the clock does not model the clients waiting for a mid-round alignment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt
from torch import nn

from fedge.algorithms.base import Context, register
from fedge.algorithms.split.alignment import Aligned, Aligner, AlignmentLoss, AlignmentStore
from fedge.algorithms.split.clients import ClientSide, State
from fedge.algorithms.split.config import SplitConfig
from fedge.algorithms.split.cost import alignment_flops
from fedge.algorithms.split.estimated import EstimatedGradientClients
from fedge.algorithms.split.parts import aux_only, build_parts
from fedge.algorithms.split.protocol import SplitLearning
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import CutBatch, Served, SharedServer, SplitServer
from fedge.comm import nodes, state_bits
from fedge.config import OptimizerConfig, aliased
from fedge.engine import Criterion, Optimizer, make_optimizer
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.rng import numpy_rng
from fedge.system import RoundCost, aligned_round
from fedge.tensors import Tensors


class FslSageConfig(SplitConfig):
    """FSL-SAGE: upload interval ``h``, which batch of a block uploads, alignment interval ``l`` and the
    alignment's store, passes, batch and optimizer (the public code's defaults)."""

    name: Literal["fsl_sage"] = "fsl_sage"
    """the algorithm (`fedge list`)"""
    h: PositiveInt = aliased(5, "upload_every", "h")
    """clients upload smashed data every this many local steps (the paper's Q)"""
    upload_phase: Literal["first", "last"] = "first"
    """which batch of each block of h uploads: the first (ceil(n/h) uploads, the code) or the last"""
    align_every: PositiveInt = aliased(10, "align_every", "l")
    """rounds between alignments of the aux models (the paper's l)"""
    align_samples: PositiveInt = 1000
    """smashed samples the server keeps per client for alignment (the most recent)"""
    align_epochs: PositiveInt = 100
    """passes over a client's stored samples per alignment"""
    align_batch_size: PositiveInt = 1000
    """samples per alignment step"""
    aux_optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(kind="adam", lr=1e-3))
    """the server's optimizer of the aux models during alignment (default: Adam, lr 0.001)"""
    alignment_timing: Literal["after_local_steps", "first_batch"] = "after_local_steps"
    """align after the local steps, or on each client's first upload, its first batch then aligned (code)"""
    alignment_loss: AlignmentLoss = "per_sample_mean"
    """per-sample mean |estimate - truth|^2, or the code's sum on mean-loss gradients (1/N of it at B = N)"""


@dataclass(frozen=True)
class ServeHooks:
    """What FSL-SAGE's server does around its steps: ``record`` sees every upload it serves; for the rows
    ``due`` names, ``after`` runs right after the step on that row's upload (``alignment_timing:
    first_batch``; neither for ``after_local_steps``)."""

    record: Callable[[CutBatch, list[int]], None]
    due: Callable[[CutBatch, list[int]], set[int]] | None = None
    after: Callable[[CutBatch, int], None] | None = None


class RecordingServer(SharedServer):
    """CSE-FSL's one shared server model, which also runs FSL-SAGE's :class:`ServeHooks` (the rows due
    for an alignment are served one upload at a time, the others' steps waiting)."""

    def __init__(
        self,
        hooks: ServeHooks,
        module: nn.Module,
        params: Tensors,
        buffers: Tensors,
        sgd: Optimizer,
        criterion: Criterion,
        fused: bool,
    ):
        super().__init__(module, params, buffers, sgd, None, criterion, fused)
        self.hooks = hooks

    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        hooks = self.hooks
        hooks.record(batch, order)
        due = set() if hooks.due is None else hooks.due(batch, order)
        if not due or hooks.after is None:
            return super().serve(batch, lr, grad_z, order)
        loss = torch.zeros(len(batch.counts), device=batch.z.device)
        for r in order:  # FSL-SAGE's clients never ask for the cut-layer gradient
            loss[r] = super().serve(batch, lr, False, [r]).loss[r]
            if r in due:
                hooks.after(batch, r)
        return Served(loss, None)


@register(
    "fsl_sage",
    FslSageConfig,
    "FSL-SAGE: clients step on an aux model's estimate of the server gradient; aux aligned every l rounds",
)
class FslSage(SplitLearning):
    """FSL-SAGE: estimated cut-layer gradients on the clients, one server model, periodic alignment."""

    cfg: FslSageConfig
    state_fields = (*SplitLearning.state_fields, "store")
    recorded = frozenset({"smashed", "labels"})  # its clients estimate the cut gradient: none comes back

    def __init__(self, ctx: Context, cfg: FslSageConfig):
        if cfg.agg_every is not None:
            raise ConfigError("algorithm.agg_every", "not used by fsl_sage (it aggregates once per round)")
        if cfg.nopeek > 0:
            raise ConfigError("algorithm.nopeek", "not supported by fsl_sage's estimated-gradient step")
        self.store = AlignmentStore(cfg.align_samples)
        self.aligned: list[Aligned] = []
        self.align_flops, self.aux_bits = 0.0, np.zeros(0)  # the round's alignment work, for the clock
        super().__init__(ctx, cfg)
        if cfg.upload_phase == "last" and cfg.h > self.most_batches():
            reason = f"no client has {cfg.h} batches in a round, so nothing would reach the server"
            raise ConfigError("algorithm.h", f"h={cfg.h} with upload_phase=last but {reason}")
        if cfg.alignment_timing == "first_batch" and not self.uploads_at(0):
            reason = f"first_batch aligns on a first batch's upload; upload_phase=last, h={cfg.h} has none"
            raise ConfigError("algorithm.alignment_timing", reason)
        self.rnd: Round | None = None  # the round in progress: the server's mid-round alignments act on it
        self.round_clients = np.zeros(0, dtype=np.int64)
        self.fresh: dict[int, Tensors] = {}  # first_batch: the round's aligned aux models, by client
        self.realigned_rows: set[int] = set()  # rows of the round that train on them
        self.served_rows: torch.Tensor | None = None  # the last served batch's rows (None: the cohort's)
        aux = self.parts.aux
        optimizer = make_optimizer(cfg.aux_optimizer)
        self.aligner = Aligner(self.parts.server, aux, ctx.criterion, optimizer, cfg.aux_optimizer.lr,
                               cfg.align_epochs, cfg.align_batch_size, cfg.alignment_loss)  # fmt: skip

    def client_side(self) -> ClientSide:
        parts = build_parts(self.ctx, with_aux=True)
        realigned = self._realigned if self.cfg.alignment_timing == "first_batch" else None
        executor, clip = self.ctx.executor, self.smashed_clip
        return EstimatedGradientClients(parts, self.client_sgd, executor, realigned, clip)

    def server_part(self, params: Tensors, buffers: Tensors) -> SplitServer:
        server, fused = self.parts.server, self.ctx.config.engine.fused
        hooks = ServeHooks(self._record)
        if self.cfg.alignment_timing == "first_batch":
            hooks = ServeHooks(self._record, self._due, self._align_after)
        return RecordingServer(hooks, server, params, buffers, self.server_sgd, self.ctx.criterion, fused)

    def uploads_at(self, step: int) -> bool:
        cfg = self.cfg
        return step % cfg.h == (0 if cfg.upload_phase == "first" else cfg.h - 1)

    def aligns(self, t: int) -> bool:
        """Whether round t (1-based) ends with an alignment: rounds 1, l + 1, 2l + 1, ..."""
        return (t - 1) % self.cfg.align_every == 0

    def begin(self, t: int) -> Round:
        rnd = super().begin(t)
        self.rnd, self.round_clients = rnd, rnd.draws.clients
        self.aligned, self.align_flops, self.aux_bits = [], 0.0, np.zeros(len(rnd.draws))
        self.fresh, self.realigned_rows = {}, set()
        return rnd

    def _client_of(self, batch: CutBatch, r: int) -> int:
        """The client of row ``r`` of a served batch."""
        return int(self.round_clients[r if batch.rows is None else int(batch.rows[r])])

    def _record(self, batch: CutBatch, order: list[int]) -> None:
        """Keep each served upload for its client's alignment (every row of the cohort: the shared
        server sees them all)."""
        self.served_rows = batch.rows
        counts = batch.counts.tolist()
        for r in order:
            self.store.add(self._client_of(batch, r), batch.z[r, : counts[r]], batch.y[r, : counts[r]])

    def aggregate_models(self, rnd: Round) -> None:
        """In an alignment round, align the participants' aux models first (after the local steps),
        then average the trunks."""
        if self.aligns(rnd.t) and self.cfg.alignment_timing == "after_local_steps":
            self.align(rnd)
        super().aggregate_models(rnd)

    def align(self, rnd: Round) -> None:
        """Align each participant's aux model to the server on its stored samples and send it down; the
        rows of this process take the aligned model (their client keeps it at aggregation)."""
        params = dict(rnd.rows.params)
        mine = self.runtime.local_clients(rnd.cohort, rnd.draws.clients)
        self.aux_bits = np.zeros(len(rnd.draws))  # the rows that answered (a deployed round may lose some)
        for client in dict.fromkeys(int(c) for c in rnd.draws.clients):
            head = self._align_client(rnd, client)
            if head is None:
                continue
            rows = torch.as_tensor(np.flatnonzero(mine == client), device=self.ctx.device)
            for name, value in head.items():
                params[name] = params[name].index_put((rows,), value.expand(len(rows), *value.shape))
        rnd.write_back(None, (params, rnd.rows.buffers, rnd.rows.opt_state))

    def _align_client(self, rnd: Round, client: int) -> Tensors | None:
        """Align ``client``'s aux model to the server's current model on its stored samples and send it
        down: the aligned model as the client receives it (None: nothing stored yet)."""
        samples = self.store.samples(client)
        if samples is None:
            return None
        rng = numpy_rng(self.ctx.seed, "fsl-sage-align", rnd.t, client)
        key = int(rng.integers(2**31))
        g = self.aligner.true_gradients(*self.server.evaluation_model(), *samples, key)
        head = self.local_aux.get(client, aux_only(self.client["params"]))
        aligned = self.aligner.align(head, self.store.optimizer_state(client), samples, g, rng)
        self.store.keep_optimizer_state(client, aligned.opt_state)
        self.aligned.append(aligned)
        self.align_flops += alignment_flops(self.flops, len(samples[1]), self.cfg.align_epochs)
        sent = self.down.send(rnd.t, nodes.SERVER, [nodes.client(client)], "aux_down", aligned.params)
        self.aux_bits[int(np.flatnonzero(rnd.draws.clients == client)[0])] += sent.bits[0]
        return sent.payload

    def _due(self, batch: CutBatch, order: list[int]) -> set[int]:
        """``first_batch`` timing: the rows of ``order`` after whose server step their client aligns, the
        first served upload of each client not yet aligned in an alignment round."""
        assert self.rnd is not None
        if not self.aligns(self.rnd.t):
            return set()
        due, seen = set(), set(self.fresh)
        for r in order:
            client = self._client_of(batch, r)
            if client not in seen:
                due.add(r)
                seen.add(client)
        return due

    def _align_after(self, batch: CutBatch, r: int) -> None:
        """Align row ``r``'s client right after the server's step on its upload (``first_batch``)."""
        assert self.rnd is not None
        client = self._client_of(batch, r)
        head = self._align_client(self.rnd, client)
        if head is not None:
            self.fresh[client] = head

    def _realigned(self, state: State) -> State | None:
        """After an upload: the state of the rows that just sent (this process's) with the aux models
        aligned since, for rows not yet given theirs; None when there are none (``first_batch``)."""
        assert self.rnd is not None
        if not self.fresh:
            return None
        rnd = self.rnd
        rows = self.served_rows
        ids = self.runtime.local_row_ids(rnd.cohort) if rows is None else rows.cpu().numpy()
        clients = self.round_clients[ids]
        update = [p for p, row in enumerate(ids.tolist()) if row not in self.realigned_rows]
        update = [p for p in update if int(clients[p]) in self.fresh]
        if not update:
            return None
        params = dict(state[0])
        for p in update:
            self.realigned_rows.add(int(ids[p]))
            at = (torch.tensor([p], device=self.ctx.device),)
            for name, value in self.fresh[int(clients[p])].items():
                params[name] = params[name].index_put(at, value[None])
        return params, state[1], state[2]

    def round_cost(self, rnd: Round) -> RoundCost:
        """The split round's cost, followed in an alignment round by the alignment and the aligned aux
        models' downloads."""
        cost = super().round_cost(rnd)
        if not self.aligned:
            return cost
        return aligned_round(self.ctx.system, rnd.t, cost, self.align_flops, rnd.draws.clients, self.aux_bits)

    def hold_storage(self, count: int, participants: list[str]) -> None:
        """Besides the split family's storage, the server holds every client's alignment samples and a
        copy of its aux model."""
        super().hold_storage(count, participants)
        heads = len(self.store.data) * state_bits(aux_only(self.client["params"]))
        self.runtime.store(nodes.SERVER, "alignment", self.store.bits() + heads)

    def round_report(self, rnd: Round) -> RoundReport:
        report = super().round_report(rnd)
        done = self.aligned
        figures: dict[str, float] = {"aligned": len(done)}
        if done:
            figures["align_loss_before"] = float(np.mean([a.loss_before for a in done]))
            figures["align_loss_after"] = float(np.mean([a.loss_after for a in done]))
        return RoundReport(report.train_loss, {**report.extra, **figures})
