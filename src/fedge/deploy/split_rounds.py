"""The deployed split-learning algorithms of the shared round (CSE-FSL, FSL_AN, FSL-SAGE, SplitFed v1 and
v2): the simulated split round, unchanged, with its local steps run on the SuperNodes (see
:mod:`fedge.deploy.rounds`). Aux-head clients (CSE-FSL, FSL_AN, FSL-SAGE) take one message a round
(FSL-SAGE's also its aligned aux model after an alignment); clients that get cut-layer gradients back
(SplitFed v1, v2) two a local step.

The round (:meth:`~fedge.algorithms.split.protocol.SplitLearning.run_round`) is inherited whole: the
draw, the broadcast through the links, the aggregation, the clock and the report are the simulation's.
What a deployed class plugs in is its local steps: instead of stepping the rows here, it sends each
row's client work to its node and feeds what comes back through the round's server exchange
(:class:`~fedge.algorithms.split.exchange.ServerExchange`), so the server side, its queue order and
the ledger are the simulation's too. Rows whose node did not answer (or answered something that does
not fit the round) leave the round before the aggregation, their weights renormalised over the rest
(and, with a server copy per client, their copies with them).

Under an ``adversary`` each attack happens where the simulation does it
(:mod:`fedge.runtime.split_adversary`): a malicious node trains on and sends its flipped labels and
poisons its smashed data before sending it (:class:`~fedge.deploy.node.Node`), so the server's exchange
takes the received data as sent (it poisons nothing itself); the uploaded client models are poisoned in
the server app at receipt, before its pipeline, as simulated.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch

from fedge.algorithms.base import Context
from fedge.algorithms.split.config import AuxHeadConfig, SplitConfig
from fedge.algorithms.split.cse_fsl import CseFsl
from fedge.algorithms.split.fsl_an import FslAn
from fedge.algorithms.split.fsl_sage import FslSage
from fedge.algorithms.split.participation import Draws, aggregation_weights
from fedge.algorithms.split.parts import aux_only
from fedge.algorithms.split.protocol import SplitLearning
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch, Served
from fedge.algorithms.split.splitfed_v1 import SplitFedV1
from fedge.algorithms.split.splitfed_v2 import SplitFedV2
from fedge.algorithms.split.tally import Tally
from fedge.comm import nodes
from fedge.data.federated import BatchPlan
from fedge.deploy.transport import Outgoing, Reply, Transport, dropout_figures
from fedge.deploy.wire import LABELS, WIRE_DTYPES, Spec, expect, labels, wire_dtype
from fedge.engine import ClientBank
from fedge.errors import ConfigError, FedgeError
from fedge.metrics import RoundReport
from fedge.tensors import Tensors, floating, rows

Cut = dict[int, tuple[torch.Tensor, torch.Tensor]]  # a step's smashed data and labels, by row


class DeployedSplit(SplitLearning):
    """The split round with each row's client side on its node. Supported: one row per client, no
    aggregation inside a round, the server fed per step (``round_robin`` or ``random`` for one shared
    model; server copies serve their own rows)."""

    transport: Transport

    def __init__(self, ctx: Context, cfg: SplitConfig):
        super().__init__(ctx, cfg)
        self.local_steps = self.remote_steps
        self.exchange.adversary = None  # the malicious nodes send their smashed data poisoned

    @abstractmethod
    def remote_steps(self, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None) -> None:
        """The round's local steps on the nodes (``subset`` is None: the server is fed per step): the
        rows' trained client models into ``rnd``, and the rows that did not come back out of it."""

    def check_deployable(self) -> None:
        """Refuse settings the deployed round does not carry out, naming the key."""
        cfg = self.cfg
        if cfg.participation == "with_replacement":
            raise ConfigError("algorithm.participation", "a deployed run needs one row per client")
        if cfg.agg_every is not None:
            raise ConfigError("algorithm.agg_every", "not supported by a deployed run")
        if cfg.server_order == "client_after_client":
            raise ConfigError("algorithm.server_order", "a deployed run feeds the server per step")
        if cfg.client_optimizer_state == "keep":
            raise ConfigError(
                "algorithm.client_optimizer_state",
                "a deployed node starts each round's optimizer state afresh",
            )
        for block in ("cut", "labels", "sample"):
            if getattr(self.ctx.config.privacy, block) is not None:
                raise ConfigError(
                    f"privacy.{block}", "a deployed node trains and sends the cut's data in clear"
                )
        for key, codec in (("codec_up", cfg.codec_up), ("codec_down", cfg.codec_down)):
            if codec not in WIRE_DTYPES:
                raise ConfigError(f"algorithm.{key}", f"{codec!r} cannot be deployed; use fp32 or fp16")

    def round_report(self, rnd: Round) -> RoundReport:
        report = super().round_report(rnd)
        return RoundReport(report.train_loss, {**report.extra, **dropout_figures(self.transport, rnd.t)})

    def _broadcast(self, rnd: Round) -> dict[str, tuple[Tensors, np.dtype]]:
        """What the broadcast delivered to every row, by record name (``model_down``, ``aux_down``)."""
        params, buffers = rows(rnd.rows.params, 0), rows(rnd.rows.buffers, 0)
        out = {}
        for name, part in self.exchanged_parts():
            sent = {**part(params), **floating(part(buffers))}
            if sent:
                out[f"{name}_down"] = (sent, wire_dtype(self.cfg.codec_down))
        return out

    def _upload_specs(self, rnd: Round) -> dict[str, dict[str, Spec]]:
        """The records and arrays a row's uploaded client model must have."""
        params, buffers = rows(rnd.rows.params, 0), rows(rnd.rows.buffers, 0)
        up = wire_dtype(self.cfg.codec_up)
        return {
            f"{name}_up": expect({**part(params), **floating(part(buffers))}, up)
            for name, part in self.exchanged_parts()
        }

    def _keep_uploads(self, rnd: Round, uploads: dict[int, dict[str, Tensors]]) -> None:
        """Write each row's uploaded client model (its ``model_up``/``aux_up`` records; ``uploads`` by
        row) into the round's stacked state."""
        params, buffers = dict(rnd.rows.params), dict(rnd.rows.buffers)
        parts = {f"{name}_up" for name, _ in self.exchanged_parts()}
        for r, records in uploads.items():
            for payload in (records[name] for name in parts if name in records):
                for k, v in payload.items():
                    target = params if k in params else buffers
                    target[k] = target[k].index_put((torch.tensor([r]),), v.to(target[k]).unsqueeze(0))
        rnd.rows.adopt(params, buffers, rnd.rows.opt_state, owned=False)

    def _keep_only(self, rnd: Round, alive: list[int]) -> None:
        """Restrict the round to the rows ``alive`` (weights renormalised over them)."""
        if len(alive) == len(rnd.draws):
            return
        if not alive:
            raise FedgeError(f"round {rnd.t}: no client replied ({self.transport.dropped.get(rnd.t)})")
        cfg, ctx, old, d = self.cfg, self.ctx, rnd.tally, rnd.draws
        keep = torch.tensor(alive, device=ctx.device)
        draws = Draws(d.clients[alive], d.occurrence[alive], d.multiplicity[alive])
        sizes, m = ctx.data.client_sizes(draws.clients), ctx.data.num_clients
        weights = aggregation_weights(draws, sizes, cfg.aggregation, cfg.aggregate_divisor, m)
        bank = ClientBank(tuple(int(c) for c in draws.clients), {})
        bank.adopt(*(rows(s, keep) for s in rnd.state(None)), owned=False)
        rnd.tally = Tally(
            old.up_bits[alive], old.down_bits[alive], old.client_samples[alive], old.server_samples[alive],
            old.loss_sum[keep], old.loss_steps[keep], old.server_loss, old.uploads,
        )  # fmt: skip
        rnd.keys = None if rnd.keys is None else rnd.keys.rows(keep)
        self.server.select_rows(keep)
        rnd.draws, rnd.nodes, rnd.rows = draws, [rnd.nodes[r] for r in alive], bank
        rnd.weights, rnd.cohort = weights.to(ctx.device), ctx.cohorts.whole(len(alive))
        rnd.timeline = None if rnd.timeline is None else rnd.timeline.only(alive)

    def _serve(self, rnd: Round, step: int, width: int, cut: Cut, grad_z: bool) -> Served:
        """Feed step ``step``'s uploads (``cut``, by row) to the round's server exchange, stacked as the
        simulation stacks them: ``[rows, width, ...]``, real rows first, zeros elsewhere."""
        count, device = len(rnd.draws), self.ctx.device
        z_row, y_row = next(iter(cut.values()))
        z = torch.zeros(count, width, *z_row.shape[1:], device=device)
        y = torch.zeros(count, width, *y_row.shape[1:], dtype=torch.int64, device=device)  # class or tokens
        counts = torch.zeros(count, dtype=torch.int64, device=device)
        for r, (zr, yr) in cut.items():
            z[r, : len(zr)], y[r, : len(yr)], counts[r] = zr.to(z), yr.to(y), len(zr)
        keys = None if rnd.keys is None else rnd.keys.at(step, SERVER_STAGE)
        every_row = torch.arange(count, device=device)
        return self.exchange(rnd, every_row, CutBatch(None, z, y, counts, keys), step, grad_z)


class AuxHeadRemote(DeployedSplit):
    """Aux-head clients (CSE-FSL, FSL_AN): one ``train`` message per client and round carries the model
    down and brings back the trained client model with the smashed data and labels of its upload steps
    (CSE-FSL every h batches, FSL_AN every batch; nothing comes back per batch). The server then serves
    those uploads step by step (one shared model in the queue order, the simulation's order, or each
    row's own copy): the clients never wait for the server."""

    def check_deployable(self) -> None:
        super().check_deployable()
        if isinstance(self.cfg, AuxHeadConfig) and not self.cfg.aggregate_aux:
            raise ConfigError("algorithm.aggregate_aux", "a deployed run needs the aux head averaged")

    def _outgoing(self, rnd: Round, client: int, broadcast: dict[str, tuple[Tensors, np.dtype]]) -> Outgoing:
        """The ``train`` message to ``client``: the round's broadcast."""
        return Outgoing(broadcast)

    def remote_steps(self, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None) -> None:
        row_of = {int(c): r for r, c in enumerate(rnd.draws.clients)}
        steps = {"loss": Spec(None, np.dtype(np.float32)), "counts": Spec(None, LABELS)}
        steps |= {"upload_steps": Spec(None, LABELS), "upload_counts": Spec(None, LABELS)}
        spec = {
            **self._upload_specs(rnd),
            "smashed_up": {"z": Spec(None, wire_dtype(self.cfg.codec_up))},
            "labels_up": {"y": Spec(None, LABELS)},
            "steps": steps,
        }
        broadcast = self._broadcast(rnd)
        outgoing = {c: self._outgoing(rnd, c, broadcast) for c in row_of}
        replies = self.transport.exchange(rnd.t, "train", outgoing, {c: spec for c in row_of})
        weight = plan.weight.sum(dim=2)  # [rows, steps] real samples
        upload_steps = [s for s in range(plan.num_steps) if self.uploads_at(s)]
        accepted = {}
        for c, reply in replies.items():
            reason = _aux_problem(reply, weight[row_of[c]], upload_steps)
            if reason is None:
                accepted[row_of[c]] = reply
            else:
                self.transport.drop(rnd.t, c, f"train: rejected: {reason}")
        self._replay(rnd, plan, accepted)
        self._keep_uploads(rnd, {r: a.records for r, a in accepted.items()})
        self._keep_only(rnd, sorted(accepted))

    def _replay(self, rnd: Round, plan: BatchPlan, accepted: dict[int, Reply]) -> None:
        """The local steps' figures and, per upload step, the server's steps on the rows' uploads."""
        every_row = torch.arange(len(rnd.draws), device=self.ctx.device)
        offsets = {r: 0 for r in accepted}
        for s in range(plan.num_steps):
            counts = torch.zeros(len(rnd.draws), dtype=torch.int64, device=self.ctx.device)
            losses = torch.zeros(len(rnd.draws), device=self.ctx.device)
            for r, reply in accepted.items():
                counts[r] = int(reply.records["steps"]["counts"][s])
                losses[r] = reply.records["steps"]["loss"][s]
            if not bool(counts.any()):
                continue
            rnd.tally.local_step(every_row, counts, losses)
            if not self.uploads_at(s):
                continue
            cut = {}
            for r, reply in accepted.items():
                c, at = int(counts[r]), offsets[r]
                records = reply.records
                cut[r] = (records["smashed_up"]["z"][at : at + c], records["labels_up"]["y"][at : at + c])
                offsets[r] += c
            self._serve(rnd, s, plan.index.shape[2], cut, False)


class DeployedCseFsl(AuxHeadRemote, CseFsl):
    """CSE-FSL: its clients upload every h batches to one shared server model."""

    def check_deployable(self) -> None:
        super().check_deployable()
        if self.cfg.server_trigger != "every_h_batches":
            raise ConfigError("algorithm.server_trigger", "a deployed run supports every_h_batches")


class DeployedFslAn(AuxHeadRemote, FslAn):
    """FSL_AN: its clients upload every batch, each to its own server copy."""


class DeployedFslSage(AuxHeadRemote, FslSage):
    """FSL-SAGE: its clients train on their own aux model's estimate of the server's gradient and upload
    every h batches to one shared server model, in one ``train`` message a round, as CSE-FSL's. Each aux
    model lives on its client's node: after an alignment the server sends each aligned one down in a
    ``train.aux`` message and the node keeps it. Every ``train`` message names the round of the aux model
    the node must train with (``aux_round``, 0: the initial one); a node that missed its delivery gets
    it again with its next ``train`` message, counted as another ``aux_down``."""

    def __init__(self, ctx: Context, cfg: SplitConfig):
        super().__init__(ctx, cfg)
        self.aux_aligned: dict[int, int] = {}  # per client: the round of its latest aligned aux model
        self.aux_delivered: dict[int, int] = {}  # per client: the round of the one its node received

    def check_deployable(self) -> None:
        super().check_deployable()
        if self.cfg.alignment_timing == "first_batch":  # a node trains its round in one message
            raise ConfigError("algorithm.alignment_timing", "a deployed run aligns after the local steps")

    def _outgoing(self, rnd: Round, client: int, broadcast: dict[str, tuple[Tensors, np.dtype]]) -> Outgoing:
        """The broadcast and the round of the client's aux model, with the model itself if its node
        missed it."""
        aligned, records = self.aux_aligned.get(client, 0), dict(broadcast)
        if self.aux_delivered.get(client, 0) != aligned:
            head = aux_only(self.local_aux[client])
            sent = self.down.send(rnd.t, nodes.SERVER, [nodes.client(client)], "aux_down", head)
            row = int(np.flatnonzero(rnd.draws.clients == client)[0])
            rnd.tally.down_bits[row] += sent.bits[0]
            records["aux_down"] = (sent.payload, wire_dtype(self.cfg.codec_down))
        return Outgoing(records, {"aux_round": aligned})

    def remote_steps(self, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None) -> None:
        super().remote_steps(rnd, plan, subset)
        for client in rnd.draws.clients:  # the rows whose node replied hold their aux model now
            self.aux_delivered[int(client)] = self.aux_aligned.get(int(client), 0)

    def align(self, rnd: Round) -> None:
        """The alignment, then each aligned aux model (as the downlink delivered it) to its node."""
        super().align(rnd)
        outgoing, down = {}, wire_dtype(self.cfg.codec_down)
        for r in np.flatnonzero(self.aux_bits > 0):
            client = int(rnd.draws.clients[r])
            self.aux_aligned[client] = rnd.t
            head = aux_only(rows(rnd.rows.params, int(r)))
            outgoing[client] = Outgoing({"aux_down": (head, down)}, {"aux_round": rnd.t})
        replies = self.transport.exchange(rnd.t, "train.aux", outgoing, {c: {} for c in outgoing})
        for client in replies:
            self.aux_delivered[client] = rnd.t


def _aux_problem(reply: Reply, weight: torch.Tensor, upload_steps: list[int]) -> str | None:
    """Why an aux-head reply does not fit the round's plan (None: it fits)."""
    steps = reply.records["steps"]
    counts = weight.to(torch.int64).cpu()
    if steps["counts"].shape != counts.shape or not torch.equal(steps["counts"].cpu(), counts):
        return "per-step sample counts differ from the round's plan"
    expected = [s for s in upload_steps if int(counts[s]) > 0]
    if steps["upload_steps"].tolist() != expected:
        return f"upload steps {steps['upload_steps'].tolist()}, expected {expected}"
    rows_sent = int(sum(int(counts[s]) for s in expected))
    z, y = reply.records["smashed_up"]["z"], reply.records["labels_up"]["y"]
    if rows_sent and (len(z) != rows_sent or len(y) != rows_sent):
        return f"{len(z)} smashed rows and {len(y)} labels, expected {rows_sent}"
    return None


class GradientRemote(DeployedSplit):
    """SplitFed's clients (v1, v2): per local step, ``query.smashed`` (the forward pass to the cut; the
    first of a round carries the model down) and ``train.apply_gradients`` (the returned cut-layer
    gradient; the last of a round brings the trained client model back)."""

    def remote_steps(self, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None) -> None:
        weight = plan.weight.sum(dim=2).to(torch.int64)  # [rows, steps] real samples
        last = [int(torch.nonzero(w).max()) if bool(w.any()) else -1 for w in weight]
        alive, started, uploads = set(range(len(rnd.draws))), set(), {}
        for s in range(plan.num_steps):
            active = [r for r in sorted(alive) if int(weight[r, s]) > 0]
            if not active:
                continue
            cut = self._smashed(rnd, s, {r: int(weight[r, s]) for r in active}, started, alive)
            if not cut:
                continue
            served = self._serve(rnd, s, plan.index.shape[2], cut, True)
            counts = [len(cut[r][0]) if r in cut else 0 for r in range(len(rnd.draws))]
            every_row = torch.arange(len(rnd.draws), device=self.ctx.device)
            rnd.tally.local_step(every_row, torch.tensor(counts, device=self.ctx.device), served.loss)
            uploads |= self._apply(rnd, s, served, {r: len(cut[r][0]) for r in cut}, last, alive)
        alive &= set(uploads) | {r for r in range(len(rnd.draws)) if last[r] < 0}
        self._keep_uploads(rnd, uploads)
        self._keep_only(rnd, sorted(alive))

    def _smashed(self, rnd: Round, s: int, sizes: dict[int, int], started: set[int], alive: set[int]) -> Cut:
        """``query.smashed`` of step ``s`` to the rows ``sizes`` (their sample counts): their smashed data
        and labels; rows that do not answer, or answer with other counts, leave ``alive``."""
        clients, t = [int(c) for c in rnd.draws.clients], rnd.t
        up = wire_dtype(self.cfg.codec_up)
        outgoing = {
            clients[r]: Outgoing({} if r in started else self._broadcast(rnd), {"step": s}) for r in sizes
        }
        specs = {
            clients[r]: {"smashed_up": {"z": Spec(None, up)}, "labels_up": {"y": labels(c, self.ctx.data)}}
            for r, c in sizes.items()
        }
        replies = self.transport.exchange(t, "query.smashed", outgoing, specs)
        started.update(sizes)
        cut = {}
        for r, c in sizes.items():
            reply = replies.get(clients[r])
            if reply is not None and len(reply.records["smashed_up"]["z"]) != c:
                self.transport.drop(t, clients[r], f"query.smashed: rejected: not {c} rows")
                reply = None
            if reply is None:
                alive.discard(r)
            else:
                cut[r] = (reply.records["smashed_up"]["z"], reply.records["labels_up"]["y"])
        return cut

    def _apply(
        self, rnd: Round, s: int, served: Served, sizes: dict[int, int], last: list[int], alive: set[int]
    ) -> dict[int, dict[str, Tensors]]:
        """``train.apply_gradients`` of step ``s`` to the rows ``sizes``: the uploaded client models of
        the rows whose last step it was; rows that do not answer leave ``alive``."""
        clients, down = [int(c) for c in rnd.draws.clients], wire_dtype(self.cfg.codec_down)
        grads = {
            clients[r]: Outgoing(
                {"grad_down": ({"g": served.grad_z[r, :c]}, down)}, {"step": s, "final": s == last[r]}
            )
            for r, c in sizes.items()
        }
        final_spec = self._upload_specs(rnd)
        specs = {clients[r]: final_spec if s == last[r] else {} for r in sizes}
        applied = self.transport.exchange(rnd.t, "train.apply_gradients", grads, specs)
        alive -= {r for r in sizes if clients[r] not in applied}
        return {r: applied[clients[r]].records for r in sizes if clients[r] in applied and s == last[r]}


class DeployedSplitFedV1(GradientRemote, SplitFedV1):
    """SplitFed v1: a server copy per client returns its cut-layer gradients."""


class DeployedSplitFedV2(GradientRemote, SplitFedV2):
    """SplitFed v2: one shared server model returns the cut-layer gradients, in the queue order."""
