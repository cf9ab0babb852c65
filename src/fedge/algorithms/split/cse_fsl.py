"""CSE-FSL (Mu & Shen): aux-head clients, sparse smashed-data uploads, one shared server model.

Clients train trunk + aux head on the local loss (Eq. 8, Algorithm 1) and send the smashed data and
labels of one batch per block of h local batches: by default the last batch of each block (steps h, 2h,
...; floor(n/h) uploads of n batches), with ``upload_phase: first`` the first (steps 1, h + 1, ...;
ceil(n/h) uploads, Algorithm 1's ``m mod h == 0`` read literally, as a peer implementation does); see
docs/decisions.md, "The last batch of each block of h is uploaded". Nothing comes back. The single
server model takes one SGD step per arrival (Eq. 11, Algorithm 2), in a deterministic queue order
(round-robin per block, or a fresh random permutation per block with ``server_order: random``, Fig. 6).
Leftover batches after the last complete block train locally (with ``first``, the first of them uploads),
or are skipped with ``drop_incomplete_block`` (the authors' code's choice; the peer keeps them).

The SplitFed theory paper's variant (its Algorithm 1) is ``server_trigger: every_l_rounds``: the server
learns only in rounds t - 1 = l, 2l, ... (the theory's t counts from 0; ``server_every`` is l), at the
round's start, one step per participant on a fresh batch passed through the just-broadcast client model.
With ``zb_step: server_backprop`` (that paper's Algorithm 1, lines 25-30) the server returns that batch's
cut-layer gradient and the client's first step back-propagates it through the trunk, the aux head
untouched; with ``local_steps`` K the client then makes K - 1 aux steps, otherwise its local epochs.
Three presets (docs/split.md): ``cse_fsl_original`` is the default; ``analysis_pure`` is
``server_trigger=every_l_rounds``; ``seed_algorithm1`` adds ``zb_step=server_backprop``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import PositiveInt

from fedge.algorithms.base import Context, register
from fedge.algorithms.split.clients import State
from fedge.algorithms.split.config import AuxHeadConfig
from fedge.algorithms.split.parts import trunk_only
from fedge.algorithms.split.plans import limit_steps
from fedge.algorithms.split.protocol import LocalLoss
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch, Served, SharedServer, SplitServer
from fedge.config import aliased
from fedge.data.federated import BatchPlan
from fedge.errors import ConfigError
from fedge.rng import numpy_rng
from fedge.tensors import Tensors


class CseFslConfig(AuxHeadConfig):
    """CSE-FSL: upload interval ``h``, which batch of a block uploads, incomplete blocks, and the theory
    variant's trigger, l and z_b step."""

    name: Literal["cse_fsl"] = "cse_fsl"
    """the algorithm (`fedge list`)"""
    h: PositiveInt = aliased(1, "upload_every", "h")
    """clients upload smashed data every this many local steps (CSE-FSL's h)"""
    upload_phase: Literal["last", "first"] = "last"
    """which batch of each block of h uploads: the last (floor(n/h) uploads) or the first (ceil(n/h))"""
    drop_incomplete_block: bool = False
    """drop a round's last local steps that do not fill a block of h"""
    server_trigger: Literal["every_h_batches", "every_l_rounds"] = "every_h_batches"
    """the server learns from each upload, or only every l rounds (the theory variant)"""
    server_every: PositiveInt = aliased(1, "server_every", "l")
    """every_l_rounds: rounds between the server's learning passes (l)"""
    zb_step: Literal["aux", "server_backprop"] = "aux"
    """the theory variant's z_b step: by the aux head, or by server back-propagation"""


@register(
    "cse_fsl",
    CseFslConfig,
    "CSE-FSL: client aux head, smashed data every h batches, one server model fed by a FIFO queue",
)
class CseFsl(LocalLoss):
    """CSE-FSL: aux head on every client, one shared server model, uploads every h local batches."""

    cfg: CseFslConfig

    def __init__(self, ctx: Context, cfg: CseFslConfig):
        if cfg.server_trigger == "every_h_batches":
            for key, value in (("server_every", cfg.server_every != 1), ("zb_step", cfg.zb_step != "aux")):
                if value:
                    raise ConfigError(f"algorithm.{key}", "only used with server_trigger=every_l_rounds")
        else:
            only_h = (
                ("h", cfg.h != 1),
                ("upload_phase", cfg.upload_phase != "last"),
                ("drop_incomplete_block", cfg.drop_incomplete_block),
            )
            for key, value in only_h:
                if value:
                    raise ConfigError(f"algorithm.{key}", "only used with server_trigger=every_h_batches")
        super().__init__(ctx, cfg)
        most = self.most_batches()
        if cfg.server_trigger == "every_h_batches" and cfg.upload_phase == "last" and cfg.h > most:
            reason = f"no client has more than {most} batches in a round, so the server would never train"
            raise ConfigError("algorithm.h", f"h={cfg.h} but {reason}")

    def server_part(self, params: Tensors, buffers: Tensors) -> SplitServer:
        server, fused = self.clients.parts.server, self.ctx.config.engine.fused
        return SharedServer(server, params, buffers, self.server_sgd, None, self.ctx.criterion, fused)

    def uploads_at(self, step: int) -> bool:
        cfg = self.cfg
        phase = 0 if cfg.upload_phase == "first" else cfg.h - 1
        return cfg.server_trigger == "every_h_batches" and step % cfg.h == phase

    def server_round(self, t: int) -> bool:
        """Whether round t (1-based) is a server round of the every-l-rounds trigger (theory t = t - 1)."""
        cfg = self.cfg
        return cfg.server_trigger == "every_l_rounds" and t > 1 and (t - 1) % cfg.server_every == 0

    def step_limits(self, t: int, plan: BatchPlan) -> BatchPlan:
        cfg = self.cfg
        limits = plan.steps.numpy().copy()
        if cfg.drop_incomplete_block:
            limits = limits // cfg.h * cfg.h
        if self.server_round(t) and cfg.zb_step == "server_backprop" and cfg.local_steps is not None:
            limits = np.minimum(limits, cfg.local_steps - 1)
        return limit_steps(plan, limits)

    def cut_sends(self, rnd: Round, plan: BatchPlan) -> tuple[np.ndarray, np.ndarray]:
        """The upload steps' samples, and in a server round of the every-l-rounds trigger the server
        batch (whose cut gradient comes back with ``zb_step: server_backprop``)."""
        sent, returned = super().cut_sends(rnd, plan)
        if not self.server_round(rnd.t):
            return sent, returned
        index, _, counts = self._server_batches(rnd)
        width = torch.arange(index.shape[1], device=index.device)
        batch = torch.where(width < counts[:, None], index, -1).cpu().numpy()
        back = batch if self.cfg.zb_step == "server_backprop" else batch[:, :0]
        return np.concatenate([sent, batch], axis=1), np.concatenate([returned, back], axis=1)

    def sample_uses(self, rnd: Round, plan: BatchPlan) -> np.ndarray:
        """Every local step's samples, and in a server round with ``zb_step: server_backprop`` the
        server batch, whose returned cut gradient steps the trunk."""
        used = super().sample_uses(rnd, plan)
        if not (self.server_round(rnd.t) and self.cfg.zb_step == "server_backprop"):
            return used
        index, _, counts = self._server_batches(rnd)
        width = torch.arange(index.shape[1], device=index.device)
        return np.concatenate([used, torch.where(width < counts[:, None], index, -1).cpu().numpy()], axis=1)

    def _server_batches(self, rnd: Round) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One fresh batch per row for the server pass: sample indices, labels, real-row counts (every
        row's, on every process: each row's draw comes from its own stream)."""
        data, width = self.training(rnd.t), self.cfg.batch_size  # a backdoor's stamped view
        index = np.zeros((len(rnd.draws), width), dtype=np.int64)
        counts = np.zeros(len(rnd.draws), dtype=np.int64)
        for r, (client, k) in enumerate(zip(rnd.draws.clients, rnd.draws.occurrence, strict=True)):
            own = data.client_train[int(client)]
            rng = numpy_rng(self.ctx.seed, "server-batch", rnd.t, int(client), int(k))
            chosen = rng.choice(own, size=min(width, len(own)), replace=False)
            index[r] = own[0]  # padding repeats a valid index; counts[r] marks the real rows
            index[r, : len(chosen)] = chosen
            counts[r] = len(chosen)
        index_t = torch.from_numpy(index).to(data.device)
        return index_t, self.local_steps.sent(rnd.t)[index_t], torch.from_numpy(counts).to(data.device)

    def server_pass(self, rnd: Round) -> tuple[State, np.ndarray]:
        """The every-l-rounds server pass (the SplitFed convergence paper's Algorithm 1): each row's fresh
        batch through the just-broadcast trunk to the server, with or without the z_b step. The client
        side runs this process's rows (the round's cohort); the exchange sees every row's labels and
        counts."""
        if not self.server_round(rnd.t):
            return super().server_pass(rnd)
        index, y, counts = self._server_batches(rnd)
        keys, own, cohort = rnd.keys, self.runtime.local_rows, rnd.cohort
        x, own_counts = self.training(rnd.t).x_train[own(cohort, index)], own(cohort, counts)
        client_keys = None if keys is None else own(cohort, keys.at(-1))
        server_keys = None if keys is None else keys.at(-1, SERVER_STAGE)
        every_row = torch.arange(len(rnd.draws), device=self.ctx.device)

        def serve(z: torch.Tensor, grad_z: bool) -> Served:
            batch = CutBatch(None, z, y, counts, server_keys, samples=index)
            return self.exchange(rnd, every_row, batch, -1, grad_z)

        params, buffers, opt_state = rnd.state(None)
        samples = counts.cpu().numpy()
        if self.cfg.zb_step == "aux":
            with torch.no_grad():
                out = self.ctx.executor.map(
                    self.clients.forward,
                    state=(buffers,),
                    batch=(x,),
                    shared=(),
                    counts=own_counts,
                    inputs=(trunk_only(params),),
                    keys=client_keys,
                    stage="forward",
                )
            serve(out.per_sample[0], False)
            return (params, out.state[0], opt_state), samples
        noise = None
        if self.sample_privacy is not None:  # privacy.sample: the pass's trunk step is DP-SGD too
            at = self.runtime.local_row_ids(cohort)
            noise = self.sample_privacy.at(
                rnd.t, rnd.draws.clients[at], rnd.draws.occurrence[at], -1, own_counts
            )
        step = self.clients.backprop_step(
            (params, buffers, opt_state), x, own_counts, rnd.lr_client, client_keys, serve, noise
        )
        return step.state, samples
