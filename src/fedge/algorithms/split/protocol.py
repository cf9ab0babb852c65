"""The split-learning round, written once for SplitFed v1/v2, FSL_AN and CSE-FSL.

A round (CSE-FSL Algorithms 1-2 and its baselines, Sec. VI-A; the SplitFed theory paper's Algorithm 1): draw
the participants; broadcast the averaged client model (and aux head); run the local steps, where every step
either

- trains trunk + aux head on the local (auxiliary) loss and, at upload steps, sends that batch's smashed
  data and labels to the server, which takes one SGD step and sends nothing back (FSL_AN, CSE-FSL), or
- sends the smashed data and labels, lets the server step and return the cut-layer gradient, and
  back-propagates it through the trunk (SplitFed v1 = FSL_MC, v2 = FSL_OC);

then upload the client models and average them. The server side is either one copy per participant (FSL_MC,
FSL_AN: updated in parallel, averaged at each aggregation) or one shared model (FSL_OC, CSE-FSL) fed by a FIFO
queue in ``server_order`` (a deterministic simulation of CSE-FSL's asynchronous queue, Fig. 3). Client work
and server copies run through the executor's :class:`~fedge.engine.split.ClientMap`; the shared server model's
updates are a sequential loop in queue order on both executors.

Every transfer is a ledger entry with bits from the codec: ``model_down``/``aux_down`` (broadcast),
``smashed_up``, ``labels_up`` (kept apart so label-free figures such as CSE-FSL Table V can be read off),
``grad_down`` and ``model_up``/``aux_up``. Storage: the server holds its model copies (``server_model``)
and the uploaded client models it averages (``client_models``); each participant its trunk and aux head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.fedavg import state_bits
from fedge.algorithms.split.config import SplitConfig
from fedge.algorithms.split.latency import count_flops, round_cost
from fedge.algorithms.split.participation import Draws, aggregation_weights, check_participation, draw
from fedge.algorithms.split.parts import aux_only, build_parts, composed, initial_state, trunk_only
from fedge.algorithms.split.plans import round_plan
from fedge.comm import client_node, get_codec
from fedge.data.federated import BatchPlan
from fedge.engine import SGD, evaluate_model, stack_copies, weighted_sum
from fedge.engine.split import client_map, make_apply, make_aux_step, make_forward, make_server_step
from fedge.errors import ConfigError
from fedge.rng import derive_seed, numpy_rng

Tensors = dict[str, torch.Tensor]


def _take(tensors: Tensors, rows: torch.Tensor) -> Tensors:
    """The rows ``rows`` of stacked state."""
    return {name: t[rows] for name, t in tensors.items()}


def _put(tensors: Tensors, rows: torch.Tensor, values: Tensors) -> None:
    """Write ``values`` back into the rows ``rows`` of stacked state (new tensors, same dict)."""
    for name, t in values.items():
        tensors[name] = tensors[name].index_put((rows,), t)


def _floating(tensors: Tensors) -> Tensors:
    """What travels of a state: floating tensors only (integer counters such as BatchNorm's stay home)."""
    return {name: t for name, t in tensors.items() if t.is_floating_point()}


@dataclass
class RoundState:
    """Stacked state of one round's rows (one per draw) and the round's running figures."""

    t: int
    draws: Draws
    nodes: list[str]
    weights: torch.Tensor
    lr_client: float
    lr_server: float
    params: Tensors = field(default_factory=dict)
    buffers: Tensors = field(default_factory=dict)
    opt_state: Tensors = field(default_factory=dict)
    server: dict[str, Tensors] = field(default_factory=dict)
    loss_sum: torch.Tensor | None = None
    loss_steps: torch.Tensor | None = None
    server_loss: float = 0.0
    server_steps: int = 0
    uploads: int = 0
    up_bits: np.ndarray | None = None
    down_bits: np.ndarray | None = None
    client_samples: np.ndarray | None = None
    server_samples: np.ndarray | None = None

    def __post_init__(self) -> None:
        rows = len(self.draws)
        self.up_bits, self.down_bits = np.zeros(rows), np.zeros(rows)
        self.client_samples, self.server_samples = np.zeros(rows), np.zeros(rows)


class SplitLearning(Algorithm):
    """Base of the split family: subclasses set whether clients have an aux head (local loss, no returned
    gradient) and whether the server keeps one model copy per participant."""

    uses_aux: ClassVar[bool]
    server_copies: ClassVar[bool]
    cfg: SplitConfig

    def __init__(self, ctx: Context, cfg: SplitConfig):
        super().__init__(ctx, cfg)
        self.parts = build_parts(ctx, self.uses_aux)
        self.rows = check_participation(cfg.participation, cfg.clients_per_round, ctx.data.num_clients)
        if cfg.agg_every is not None and cfg.server_order == "client_after_client":
            raise ConfigError("algorithm.agg_every", "needs server_order round_robin or random")
        client, client_buffers, server, server_buffers = initial_state(self.parts, cfg.init, ctx.seed)
        client_opt, server_opt = cfg.optimizer, cfg.server_optimizer or cfg.optimizer
        self.client_sgd = SGD(momentum=client_opt.momentum, weight_decay=client_opt.weight_decay)
        self.server_sgd = SGD(momentum=server_opt.momentum, weight_decay=server_opt.weight_decay)
        self.client = {"params": client, "buffers": client_buffers}
        self.server = {"params": server, "buffers": server_buffers, "opt_state": self.server_sgd.init(server)}
        self.eval_server: dict[str, Tensors] | None = None
        self.shares_aux = getattr(cfg, "aggregate_aux", True)
        self.local_aux: dict[int, Tensors] = {}  # each client's own aux head when it is not averaged
        self.totals = {"uploads": 0, "server_steps": 0}
        self.cmap = client_map(ctx.executor.name)
        clip = getattr(cfg, "clip_norm", None)
        self.forward = make_forward(self.parts.trunk)
        self.apply = make_apply(self.client_sgd, clip)
        self.server_steps = {
            grad_z: make_server_step(self.parts.server, self.server_sgd, clip, grad_z, self.server_copies)
            for grad_z in (False, True)
        }
        if self.uses_aux:
            post = getattr(cfg, "smashed_from", "pre_step") == "post_step"
            self.local_step = make_aux_step(self.parts.local, self.client_sgd, post)
        self.up, self.down = get_codec(cfg.codec_up), get_codec(cfg.codec_down)
        self.flops = count_flops(self.parts)
        self._set_storage(self.rows, [])

    # ----- hooks for subclasses -------------------------------------------------------------------------

    def uploads_at(self, step: int) -> bool:
        """Whether local step ``step`` (0-based in the round) uploads its smashed data (aux algorithms)."""
        return True

    def step_limits(self, rnd: RoundState, plan: BatchPlan) -> BatchPlan:
        """The plan after algorithm-specific cuts (CSE-FSL drops incomplete upload blocks on request)."""
        return plan

    def before_local_steps(self, rnd: RoundState) -> None:
        """Work at the start of the round's local phase (CSE-FSL's every-l-rounds server pass)."""

    # ----- the round -------------------------------------------------------------------------------------

    def learning_rates(self, t: int) -> tuple[float, float]:
        """Client and server step sizes in round t (decayed; server optionally divided by m; the client's
        0 after ``freeze_client_after``, which keeps the server's objective fixed)."""
        cfg = self.cfg
        decay = cfg.lr_decay ** ((t - 1) // cfg.lr_decay_every)
        server = (cfg.server_optimizer or cfg.optimizer).lr * decay
        if cfg.server_lr_divide_by_m:
            server /= self.ctx.data.num_clients
        frozen = cfg.freeze_client_after is not None and t > cfg.freeze_client_after
        return 0.0 if frozen else cfg.optimizer.lr * decay, server

    def run_round(self, t: int) -> dict[str, float]:
        ctx, cfg = self.ctx, self.cfg
        draws = draw(
            ctx.seed, t, ctx.data.num_clients, cfg.participation, cfg.clients_per_round, cfg.duplicates
        )
        sizes = ctx.data.client_sizes(draws.clients)
        weights = aggregation_weights(
            draws, sizes, cfg.aggregation, cfg.aggregate_divisor, ctx.data.num_clients
        )
        lr_client, lr_server = self.learning_rates(t)
        nodes = [client_node(int(c)) for c in draws.clients]
        rnd = RoundState(t, draws, nodes, weights.to(ctx.device), lr_client, lr_server)
        torch.manual_seed(derive_seed(ctx.seed, "train-noise", t))
        self.parts.model.train()
        self.parts.local.train()
        self._download(rnd)
        rnd.opt_state = stack_copies(self.client_sgd.init(self.client["params"]), len(draws))
        rnd.loss_sum = torch.zeros(len(draws), device=ctx.device)
        rnd.loss_steps = torch.zeros(len(draws), device=ctx.device)
        plan = round_plan(
            ctx.data, draws, t, cfg.batch_size, cfg.local_epochs, cfg.local_steps, cfg.drop_last
        )
        self.before_local_steps(rnd)
        plan = self.step_limits(rnd, plan)
        if cfg.server_order == "client_after_client":
            for r in range(len(draws)):
                self._local_steps(rnd, plan, torch.tensor([r], device=ctx.device))
        else:
            self._local_steps(rnd, plan, None)
        self._aggregate(rnd)
        self._set_storage(len(draws), nodes)
        ctx.system.clock.advance(
            *round_cost(
                ctx.system,
                t,
                draws.clients,
                rnd.up_bits,
                rnd.down_bits,
                rnd.client_samples,
                rnd.server_samples,
                self.flops,
                shared_server=not self.server_copies,
            )
        )
        self.totals["uploads"] += rnd.uploads
        self.totals["server_steps"] += rnd.server_steps
        per_row = (rnd.loss_sum / rnd.loss_steps.clamp_min(1)).double().cpu()
        return {
            "train_loss": float((per_row * weights.cpu() / weights.sum()).sum()),
            "server_loss": rnd.server_loss / max(rnd.server_steps, 1),
            "participants": len(draws),
            "uploads": rnd.uploads,
            "uploads_total": self.totals["uploads"],
            "server_steps_total": self.totals["server_steps"],
            "lr": lr_client,
        }

    def _local_steps(self, rnd: RoundState, plan: BatchPlan, rows: torch.Tensor | None) -> None:
        """Every local step of the rows ``rows`` (all rows for ``None``), with its server traffic."""
        cfg, data = self.cfg, self.ctx.data
        index, weight = (plan.index, plan.weight) if rows is None else (plan.index[rows], plan.weight[rows])
        state = (rnd.params, rnd.buffers, rnd.opt_state)
        if rows is not None:
            state = tuple(_take(s, rows) for s in state)
            server = {k: _take(v, rows) for k, v in rnd.server.items()} if self.server_copies else rnd.server
        else:
            server = rnd.server
        params, buffers, opt_state = state
        row_ids = torch.arange(index.shape[0], device=index.device) if rows is None else rows
        for s in range(index.shape[1]):
            w = weight[:, s]
            counts = (w > 0).sum(dim=1)
            if not bool(counts.any()):
                continue
            x, y = data.x_train[index[:, s]], data.y_train[index[:, s]]
            if self.uses_aux:
                (params, buffers, opt_state), (loss,), (z,) = self.cmap(
                    self.local_step, (params, buffers, opt_state), (x, y, w), (rnd.lr_client,), counts
                )
                if self.uploads_at(s):
                    server, _, _ = self._serve(rnd, row_ids, server, z, y, counts, s, grad_z=False)
            else:
                z, buffers, pullback = self.cmap.forward_with_vjp(self.forward, params, buffers, x, counts)
                server, loss, grad_z = self._serve(rnd, row_ids, server, z, y, counts, s, grad_z=True)
                (params, opt_state), _, _ = self.cmap(
                    self.apply, (params, opt_state), (), (rnd.lr_client,), counts, inputs=(pullback(grad_z),)
                )
            active = (counts > 0).to(rnd.loss_sum)
            np.add.at(rnd.client_samples, row_ids.cpu().numpy(), counts.cpu().numpy())
            rnd.loss_sum.index_add_(0, row_ids, loss.detach().to(rnd.loss_sum) * active)
            rnd.loss_steps.index_add_(0, row_ids, active)
            if cfg.agg_every is not None and (s + 1) % cfg.agg_every == 0 and s + 1 < index.shape[1]:
                rnd.params, rnd.buffers, rnd.server = params, buffers, server
                self._aggregate(rnd)
                self._download(rnd)
                params, buffers, server = rnd.params, rnd.buffers, rnd.server
        if rows is None:
            rnd.params, rnd.buffers, rnd.opt_state, rnd.server = params, buffers, opt_state, server
            return
        for full, part in ((rnd.params, params), (rnd.buffers, buffers), (rnd.opt_state, opt_state)):
            _put(full, rows, part)
        if self.server_copies:
            for key, part in server.items():
                _put(rnd.server[key], rows, part)
        else:
            rnd.server = server

    def queue_order(self, t: int, step: int, senders: list[int]) -> list[int]:
        """The order in which the shared server model processes this step's uploads (CSE-FSL Fig. 6)."""
        if self.cfg.server_order != "random" or len(senders) < 2:
            return senders
        perm = numpy_rng(self.ctx.seed, "server-order", t, step).permutation(len(senders))
        return [senders[i] for i in perm]

    def _serve(
        self,
        rnd: RoundState,
        row_ids: torch.Tensor,
        server: dict[str, Tensors],
        z: torch.Tensor,
        y: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        grad_z: bool,
    ) -> tuple[dict[str, Tensors], torch.Tensor, torch.Tensor | None]:
        """Upload this step's smashed data and labels, run the server steps, return gradients if asked.

        Returns the new server state, the server loss per row and (with ``grad_z``) the cut-layer
        gradients as the clients receive them (zero for rows that sent nothing).
        """
        ledger, t = self.ctx.ledger, rnd.t
        senders = torch.nonzero(counts > 0).flatten().tolist()
        sizes = [int(counts[r]) for r in senders]
        nodes = [rnd.nodes[int(row_ids[r])] for r in senders]
        z = self.up.transmit({"z": z.detach()}, stacked=True).payload["z"]
        bits_z = [int(self.up.transmit({"z": z[r, :c]}).bits[0]) for r, c in zip(senders, sizes, strict=True)]
        bits_y = [int(self.up.transmit({"y": y[r, :c]}).bits[0]) for r, c in zip(senders, sizes, strict=True)]
        ledger.record(t, nodes, "server", "smashed_up", bits_z)
        ledger.record(t, nodes, "server", "labels_up", bits_y)
        rows = row_ids[senders].cpu().numpy()
        np.add.at(rnd.up_bits, rows, np.add(bits_z, bits_y))
        np.add.at(rnd.server_samples, rows, sizes)
        step_fn = self.server_steps[grad_z]
        lr = rnd.lr_server
        if self.server_copies:
            weight = (torch.arange(z.shape[1], device=z.device)[None, :] < counts[:, None]).to(z)
            state = (server["params"], server["buffers"], server["opt_state"])
            (p, b, o), (loss,), out = self.cmap(step_fn, state, (z, y, weight), (lr,), counts)
            server = {"params": p, "buffers": b, "opt_state": o}
            grads = out[0] if grad_z else None
            rnd.server_loss += float(loss.sum())
        else:
            loss = torch.zeros(len(counts), device=z.device)
            grads = torch.zeros_like(z) if grad_z else None
            p, b, o = server["params"], server["buffers"], server["opt_state"]
            for r in self.queue_order(t, step, senders):
                c = int(counts[r])
                ones = torch.ones(c, device=z.device)
                (p, b, o), (value,), out = step_fn(p, b, o, z[r, :c], y[r, :c], ones, lr)
                loss[r] = value
                if grad_z:
                    grads[r, :c] = out[0]
            server = {"params": p, "buffers": b, "opt_state": o}
            rnd.server_loss += float(loss.sum())
        rnd.server_steps += len(senders)
        rnd.uploads += len(senders)
        if grad_z:
            grads = self.down.transmit({"g": grads}, stacked=True).payload["g"]
            bits_g = [
                int(self.down.transmit({"g": grads[r, :c]}).bits[0])
                for r, c in zip(senders, sizes, strict=True)
            ]
            ledger.record(t, "server", nodes, "grad_down", bits_g)
            np.add.at(rnd.down_bits, rows, bits_g)
        return server, loss, grads

    def _download(self, rnd: RoundState) -> None:
        """Broadcast the global client model (and aux head) to every row; stack the server copies.

        Unshared aux heads (``aggregate_aux: false``) stay on their clients: each row starts from its
        client's own head (the initial one on a first visit) and nothing about them is sent.
        """
        rows, ledger = len(rnd.draws), self.ctx.ledger
        params, buffers = self.client["params"], self.client["buffers"]
        received: Tensors = {}
        for kind, part in self._exchanged(("model_down", "aux_down")):
            sent = {**part(params), **_floating(part(buffers))}
            if sent:
                encoded = self.down.transmit(sent)
                ledger.record(rnd.t, "server", rnd.nodes, kind, np.repeat(encoded.bits, rows))
                rnd.down_bits += encoded.bits[0]
                received.update(encoded.payload)
        rnd.params = stack_copies({k: received.get(k, v) for k, v in params.items()}, rows)
        rnd.buffers = stack_copies({k: received.get(k, v) for k, v in buffers.items()}, rows)
        if not self.shares_aux:
            for name in aux_only(params):
                own = [self.local_aux.get(int(c), params)[name] for c in rnd.draws.clients]
                rnd.params[name] = torch.stack(own)
        if self.server_copies:
            server = {key: self.server[key] for key in ("params", "buffers")}
            server["opt_state"] = self.server_sgd.init(self.server["params"])
            rnd.server = {key: stack_copies(value, rows) for key, value in server.items()}
        else:
            rnd.server = self.server

    def _exchanged(self, kinds: tuple[str, str]) -> list[tuple[str, Any]]:
        """The (ledger kind, state selector) pairs that travel: the trunk, and the aux head if shared."""
        pairs = [(kinds[0], trunk_only), (kinds[1], aux_only)]
        return pairs if self.shares_aux else pairs[:1]

    def _aggregate(self, rnd: RoundState) -> None:
        """Upload every row's client model, average (and average the server copies) with the round weights.

        The new global client model is ``old + global_lr * (average - old)`` (an extension: eta_g in the
        notation of Yang et al.; 1 is the plain average). Unshared aux heads are kept per client (the mean of
        its rows' heads).
        """
        ledger = self.ctx.ledger
        uploaded: Tensors = {}
        for kind, part in self._exchanged(("model_up", "aux_up")):
            sent = {**part(rnd.params), **_floating(part(rnd.buffers))}
            if sent:
                encoded = self.up.transmit(sent, stacked=True)
                ledger.record(rnd.t, rnd.nodes, "server", kind, encoded.bits)
                rnd.up_bits += encoded.bits
                uploaded.update(encoded.payload)
        params = {k: uploaded.get(k, v) for k, v in rnd.params.items()}
        buffers = {k: uploaded.get(k, v) for k, v in rnd.buffers.items()}
        average = weighted_sum(params, rnd.weights)
        old, step = self.client["params"], self.cfg.global_lr
        new_params = {k: v if step == 1.0 else old[k] + step * (v - old[k]) for k, v in average.items()}
        if not self.shares_aux:
            for client in np.unique(rnd.draws.clients):
                rows = torch.as_tensor(np.flatnonzero(rnd.draws.clients == client), device=self.ctx.device)
                self.local_aux[int(client)] = {k: params[k][rows].mean(dim=0) for k in aux_only(params)}
            new_params.update(aux_only(old))
        self.client = {"params": new_params, "buffers": weighted_sum(buffers, rnd.weights)}
        if self.server_copies:
            copies = rnd.server
            if getattr(self.cfg, "copies_eval", "avg") == "copy0":
                self.eval_server = {
                    key: {k: v[0] for k, v in copies[key].items()} for key in ("params", "buffers")
                }
            share = rnd.weights / rnd.weights.sum()
            self.server = {
                "params": weighted_sum(copies["params"], share),
                "buffers": weighted_sum(copies["buffers"], share),
                "opt_state": {},
            }
        else:
            self.server = rnd.server

    def _set_storage(self, rows: int, nodes: list[str]) -> None:
        """Server: its model copies and the ``rows`` client uploads it averages; each node: trunk + aux."""
        ledger = self.ctx.ledger
        params, buffers = self.client["params"], self.client["buffers"]
        server_bits = state_bits(self.server["params"], self.server["buffers"])
        ledger.set_storage("server", "server_model", server_bits * (rows if self.server_copies else 1))
        trunk_bits = state_bits(trunk_only(params), trunk_only(buffers))
        aux_bits = state_bits(aux_only(params), aux_only(buffers))
        ledger.set_storage(
            "server", "client_models", rows * (trunk_bits + (aux_bits if self.shares_aux else 0))
        )
        for node in nodes:
            ledger.set_storage(node, "model", trunk_bits)
            if aux_bits:
                ledger.set_storage(node, "aux", aux_bits)

    # ----- evaluation and state --------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        """The composed model (averaged trunk + server model) on the global test set; with a shared aux
        head also the accuracy of trunk + aux head."""
        data, batch = self.ctx.data, self.ctx.config.eval.batch_size
        client = self.client
        server = self.eval_server or self.server
        params = composed(client["params"], server["params"])
        buffers = composed(client["buffers"], server["buffers"])
        metrics = evaluate_model(self.parts.model, params, buffers, data.x_test, data.y_test, batch)
        if self.uses_aux and self.shares_aux:
            aux = evaluate_model(
                self.parts.local, client["params"], client["buffers"], data.x_test, data.y_test, batch
            )
            metrics.update(aux_accuracy=aux["accuracy"], aux_loss=aux["loss"])
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "server": self.server,
            "eval_server": self.eval_server,
            "local_aux": self.local_aux,
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.ctx.device

        def moved(block: dict[str, Tensors] | None) -> dict[str, Tensors] | None:
            if block is None:
                return None
            return {key: {k: v.to(device) for k, v in part.items()} for key, part in block.items()}

        self.client = moved(state["client"])
        self.server = moved(state["server"])
        self.eval_server = moved(state["eval_server"])
        self.local_aux = moved(state["local_aux"]) or {}
        self.totals = dict(state["totals"])
