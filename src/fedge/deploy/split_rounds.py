"""The server side of the deployed split-learning algorithms (CSE-FSL, SplitFed v2): the simulated
split round with each row's client side on its SuperNode (see :mod:`fedge.deploy.rounds`)."""

from __future__ import annotations

import numpy as np
import torch

from fedge.algorithms.split.cse_fsl import CseFsl
from fedge.algorithms.split.participation import Draws, aggregation_weights
from fedge.algorithms.split.plans import round_plan
from fedge.algorithms.split.protocol import SplitLearning
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch, SharedServer
from fedge.algorithms.split.splitfed_v2 import SplitFedV2
from fedge.algorithms.split.tally import Tally
from fedge.deploy.transport import Outgoing, Reply, Transport, dropout_figures
from fedge.deploy.wire import LABELS, WIRE_DTYPES, Spec, expect, wire_dtype
from fedge.engine import ClientBank
from fedge.errors import ConfigError, FedgeError
from fedge.metrics import RoundReport
from fedge.tensors import Tensors, floating, rows


class DeployedSplit(SplitLearning):
    """The split round with each row's client side on its node. Supported: one row per client, no
    aggregation inside a round, a shared server model fed per step (``round_robin`` or ``random``)."""

    transport: Transport

    def check_deployable(self) -> None:
        """Refuse settings the deployed round does not carry out, naming the key."""
        cfg = self.cfg
        if cfg.participation == "with_replacement":
            raise ConfigError("algorithm.participation", "a deployed run needs one row per client")
        if cfg.agg_every is not None:
            raise ConfigError("algorithm.agg_every", "not supported by a deployed run")
        if cfg.server_order == "client_after_client":
            raise ConfigError("algorithm.server_order", "a deployed run feeds the server per step")
        if not isinstance(self.server, SharedServer):
            raise ConfigError("algorithm.name", "a deployed split run needs one shared server model")
        for key, codec in (("codec_up", cfg.codec_up), ("codec_down", cfg.codec_down)):
            if codec not in WIRE_DTYPES:
                raise ConfigError(f"algorithm.{key}", f"{codec!r} cannot be deployed; use fp32 or fp16")

    def _broadcast(self, rnd: Round) -> dict[str, tuple[Tensors, np.dtype]]:
        """What ``_download`` delivered to every row, by record name (``model_down``, ``aux_down``)."""
        params, buffers = rows(rnd.rows.params, 0), rows(rnd.rows.buffers, 0)
        out = {}
        for name, part in self._exchanged():
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
            for name, part in self._exchanged()
        }

    def _keep_uploads(self, rnd: Round, uploads: dict[int, dict[str, Tensors]]) -> None:
        """Write each row's uploaded client model (its ``model_up``/``aux_up`` records; ``uploads`` by
        row) into the round's stacked state."""
        params, buffers = dict(rnd.rows.params), dict(rnd.rows.buffers)
        parts = {f"{name}_up" for name, _ in self._exchanged()}
        for r, records in uploads.items():
            for payload in (records[name] for name in parts if name in records):
                for k, v in payload.items():
                    target = params if k in params else buffers
                    target[k] = target[k].index_put((torch.tensor([r]),), v.to(target[k]).unsqueeze(0))
        rnd.rows.adopt(params, buffers, rnd.rows.opt_state, owned=False)

    def _survivors(self, rnd: Round, alive: list[int]) -> Round:
        """The round restricted to the rows ``alive`` (weights renormalised over them)."""
        if len(alive) == len(rnd.draws):
            return rnd
        if not alive:
            raise FedgeError(f"round {rnd.t}: no client replied ({self.transport.dropped.get(rnd.t)})")
        cfg, ctx = self.cfg, self.ctx
        keep = torch.tensor(alive, device=ctx.device)
        draws = Draws(rnd.draws.clients[alive], rnd.draws.occurrence[alive], rnd.draws.multiplicity[alive])
        sizes = ctx.data.client_sizes(draws.clients)
        weights = aggregation_weights(
            draws, sizes, cfg.aggregation, cfg.aggregate_divisor, ctx.data.num_clients
        )
        bank = ClientBank(tuple(int(c) for c in draws.clients), {})
        bank.adopt(*(rows(s, keep) for s in rnd.state(None)), owned=False)
        old = rnd.tally
        tally = Tally(
            old.up_bits[alive], old.down_bits[alive], old.client_samples[alive], old.server_samples[alive],
            old.loss_sum[keep], old.loss_steps[keep], old.server_loss, old.uploads,
        )  # fmt: skip
        keys = None if rnd.keys is None else rnd.keys.rows(keep)
        return Round(
            rnd.t, draws, [rnd.nodes[r] for r in alive], weights.to(ctx.device), rnd.lr_client, rnd.lr_server,
            bank, keys, tally, ctx.cohorts.whole(len(alive)),
        )  # fmt: skip

    def _stacked_cut(self, rnd: Round, width: int, parts: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        """Smashed data and labels of one step as the simulation stacks them: [rows, width, ...], real rows
        first, zeros elsewhere."""
        shape = next(iter(parts.values()))[0].shape[1:]
        z = torch.zeros(len(rnd.draws), width, *shape, device=self.ctx.device)
        y = torch.zeros(len(rnd.draws), width, dtype=torch.int64, device=self.ctx.device)
        for r, (zr, yr) in parts.items():
            z[r, : len(zr)] = zr.to(z)
            y[r, : len(yr)] = yr.to(y)
        return z, y

    def _finish(self, rnd: Round) -> RoundReport:
        self._aggregate(rnd)
        self._hold(len(rnd.draws), rnd.nodes)
        self._advance_clock(rnd)
        report = self._report(rnd)
        return RoundReport(report.train_loss, {**report.extra, **dropout_figures(self.transport, rnd.t)})

    def _plan(self, rnd: Round):
        cfg = self.cfg
        plan = round_plan(
            self.ctx.data, rnd.draws, rnd.t, cfg.batch_size, cfg.local_epochs, cfg.local_steps, cfg.drop_last
        )
        return self.step_limits(rnd.t, plan)


class DeployedCseFsl(DeployedSplit, CseFsl):
    """CSE-FSL: one ``train`` message per client and round carries the model down and brings back the
    trained client model with the smashed data and labels of its upload steps (every h batches; nothing
    comes back per batch). The server then feeds its model those uploads step by step in the queue
    order, which is the simulation's order: the clients never wait for the server."""

    def check_deployable(self) -> None:
        super().check_deployable()
        if self.cfg.server_trigger != "every_h_batches":
            raise ConfigError("algorithm.server_trigger", "a deployed run supports every_h_batches")
        if not self.cfg.aggregate_aux:
            raise ConfigError("algorithm.aggregate_aux", "a deployed run needs the aux head averaged")

    def run_round(self, t: int) -> RoundReport:
        rnd = self.begin(t)
        plan = self._plan(rnd)
        row_of = {int(c): r for r, c in enumerate(rnd.draws.clients)}
        up = wire_dtype(self.cfg.codec_up)
        steps = {"loss": Spec(None, np.dtype(np.float32)), "counts": Spec(None, LABELS)}
        steps |= {"upload_steps": Spec(None, LABELS), "upload_counts": Spec(None, LABELS)}
        spec = {
            **self._upload_specs(rnd),
            "smashed_up": {"z": Spec(None, up)},
            "labels_up": {"y": Spec(None, LABELS)},
            "steps": steps,
        }
        outgoing = {c: Outgoing(self._broadcast(rnd)) for c in row_of}
        replies = self.transport.exchange(t, "train", outgoing, {c: spec for c in row_of})
        weight = plan.weight.sum(dim=2)  # [rows, steps] real samples
        accepted = {}
        for c, reply in replies.items():
            r = row_of[c]
            reason = _aux_problem(reply, weight[r], [s for s in range(plan.num_steps) if self.uploads_at(s)])
            if reason is None:
                accepted[r] = reply
            else:
                self.transport.drop(t, c, f"train: rejected: {reason}")
        self._replay(rnd, plan, accepted)
        self._keep_uploads(rnd, {r: a.records for r, a in accepted.items()})
        return self._finish(self._survivors(rnd, sorted(accepted)))

    def _replay(self, rnd: Round, plan, accepted: dict[int, Reply]) -> None:
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
                cut[r] = (
                    reply.records["smashed_up"]["z"][at : at + c],
                    reply.records["labels_up"]["y"][at : at + c],
                )
                offsets[r] += c
            z, y = self._stacked_cut(rnd, plan.index.shape[2], cut)
            keys = None if rnd.keys is None else rnd.keys.at(s, SERVER_STAGE)
            self.exchange(rnd, every_row, CutBatch(None, z, y, counts, keys), s, False)


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


class DeployedSplitFedV2(DeployedSplit, SplitFedV2):
    """SplitFed v2: per local step, ``query.smashed`` (the forward pass to the cut; the first of a round
    carries the model down) and ``train.apply_gradients`` (the returned cut-layer gradient; the last of a
    round brings the trained client model back)."""

    def run_round(self, t: int) -> RoundReport:
        rnd = self.begin(t)
        plan = self._plan(rnd)
        weight = plan.weight.sum(dim=2).to(torch.int64)  # [rows, steps]
        last = [
            int(torch.nonzero(weight[r]).max()) if bool(weight[r].any()) else -1
            for r in range(len(rnd.draws))
        ]
        clients = [int(c) for c in rnd.draws.clients]
        alive, started, uploads = set(range(len(clients))), set(), {}
        every_row = torch.arange(len(clients), device=self.ctx.device)
        up, down = wire_dtype(self.cfg.codec_up), wire_dtype(self.cfg.codec_down)
        for s in range(plan.num_steps):
            active = [r for r in sorted(alive) if int(weight[r, s]) > 0]
            if not active:
                continue
            outgoing = {
                clients[r]: Outgoing({} if r in started else self._broadcast(rnd), {"step": s})
                for r in active
            }
            specs = {
                clients[r]: {
                    "smashed_up": {"z": Spec(None, up)},
                    "labels_up": {"y": Spec((int(weight[r, s]),), LABELS)},
                }
                for r in active
            }
            replies = self.transport.exchange(t, "query.smashed", outgoing, specs)
            started.update(active)
            cut = {}
            for r in active:
                reply = replies.get(clients[r])
                if reply is None:
                    alive.discard(r)
                    continue
                if len(reply.records["smashed_up"]["z"]) != int(weight[r, s]):
                    self.transport.drop(
                        t, clients[r], f"query.smashed: rejected: not {int(weight[r, s])} rows"
                    )
                    alive.discard(r)
                    continue
                cut[r] = (reply.records["smashed_up"]["z"], reply.records["labels_up"]["y"])
            if not cut:
                continue
            counts = torch.tensor([int(weight[r, s]) if r in cut else 0 for r in range(len(clients))])
            z, y = self._stacked_cut(rnd, plan.index.shape[2], cut)
            keys = None if rnd.keys is None else rnd.keys.at(s, SERVER_STAGE)
            batch = CutBatch(None, z, y, counts.to(self.ctx.device), keys)
            served = self.exchange(rnd, every_row, batch, s, True)
            rnd.tally.local_step(every_row, counts.to(self.ctx.device), served.loss)
            grads = {
                clients[r]: Outgoing(
                    {"grad_down": ({"g": served.grad_z[r, : int(counts[r])]}, down)},
                    {"step": s, "final": s == last[r]},
                )
                for r in cut
            }
            final_spec = self._upload_specs(rnd)
            specs = {clients[r]: final_spec if s == last[r] else {} for r in cut}
            applied = self.transport.exchange(t, "train.apply_gradients", grads, specs)
            for r in cut:
                if clients[r] not in applied:
                    alive.discard(r)
                elif s == last[r]:
                    uploads[r] = applied[clients[r]].records
        alive &= set(uploads) | {r for r in range(len(clients)) if last[r] < 0}
        self._keep_uploads(rnd, uploads)
        return self._finish(self._survivors(rnd, sorted(alive)))
