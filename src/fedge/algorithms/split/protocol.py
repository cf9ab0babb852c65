"""The split-learning round, written once for SplitFed v1/v2, FSL_AN and CSE-FSL.

A round (CSE-FSL Sec. II-III; the SplitFed convergence paper's Algorithm 1 with partial participation):
draw the participants; broadcast the averaged client model (and aux head); run the local steps, where
each step is the client side's (:mod:`~fedge.algorithms.split.clients`): SplitFed clients send every
batch's smashed data and labels and back-propagate the returned cut-layer gradient, aux-head clients
train on their local loss and send the smashed data of upload steps; then upload the client models and
average them. The server side is a part (:mod:`~fedge.algorithms.split.server`): a copy per participant
or one shared model fed in ``server_order``. An algorithm is the choice of the two parts plus, for
CSE-FSL, when to upload.

Every transfer goes through a link: ``model_down``/``aux_down`` (broadcast), ``smashed_up``,
``labels_up`` (kept apart so label-free figures such as CSE-FSL's Table V can be read off),
``grad_down`` and ``model_up``/``aux_up``. Storage: the server holds its model(s) (``server_model``) and
the uploaded client models it averages (``client_models``); each participant its trunk and aux head.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.split.arrival import Timeline
from fedge.algorithms.split.clients import AuxHeadClients, ClientSide, GradientClients, State
from fedge.algorithms.split.config import AuxHeadConfig, GradientReturnConfig, SplitConfig
from fedge.algorithms.split.flops import count_flops
from fedge.algorithms.split.participation import Draws, aggregation_weights, check_participation, draw
from fedge.algorithms.split.parts import aux_only, build_parts, composed, initial_state, trunk_only
from fedge.algorithms.split.plans import round_plan
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch, Served, SplitServer
from fedge.comm import FloatCodec, nodes, state_bits
from fedge.data.federated import BatchPlan
from fedge.distributed import SINGLE, Group, Shard, balanced, send_shard
from fedge.distributed.evaluate import evaluate_sharded
from fedge.engine import ClientBank, make_optimizer, stack_copies, weighted_sum
from fedge.engine.noise import RowKeys
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.rng import numpy_rng
from fedge.system import SplitWork, arrival_round, split_round, training_flops
from fedge.tensors import Tensors, floating, rows

Part = Callable[[Tensors], Tensors]


@dataclass
class Tally:
    """The running figures of one round, per participant row: bits each way, samples each side computed
    on, and the losses the rows trained on."""

    up_bits: np.ndarray
    down_bits: np.ndarray
    client_samples: np.ndarray
    server_samples: np.ndarray
    loss_sum: torch.Tensor
    loss_steps: torch.Tensor
    server_loss: float = 0.0
    uploads: int = 0

    @classmethod
    def zeros(cls, count: int, device: torch.device) -> Tally:
        figures = [np.zeros(count) for _ in range(4)]
        return cls(*figures, torch.zeros(count, device=device), torch.zeros(count, device=device))

    def local_step(self, row_ids: torch.Tensor, counts: torch.Tensor, loss: torch.Tensor) -> None:
        """Rows ``row_ids`` took a local step on ``counts`` samples with loss ``loss``."""
        self.computed(row_ids, counts)
        self.trained(row_ids, counts, loss)

    def computed(self, row_ids: torch.Tensor, counts: torch.Tensor) -> None:
        """Rows ``row_ids`` computed a local step on ``counts`` samples (known for every row everywhere:
        the batch plans come from the seed)."""
        np.add.at(self.client_samples, row_ids.cpu().numpy(), counts.cpu().numpy())

    def trained(self, row_ids: torch.Tensor, counts: torch.Tensor, loss: torch.Tensor) -> None:
        """Rows ``row_ids`` trained on loss ``loss`` (known only where the rows trained)."""
        active = (counts > 0).to(self.loss_sum)
        self.loss_sum.index_add_(0, row_ids, loss.detach().to(self.loss_sum) * active)
        self.loss_steps.index_add_(0, row_ids, active)

    def mean_loss(self, weights: torch.Tensor) -> float:
        """The rows' mean training loss, weighted like the aggregation."""
        per_row = (self.loss_sum / self.loss_steps.clamp_min(1)).double().cpu()
        weights = weights.cpu()
        return float((per_row * weights / weights.sum()).sum())


@dataclass
class Round:
    """One round's participants: their draws and node names, aggregation weights, step sizes, stacked
    client state, noise keys and running figures.

    ``group`` is the processes the rows are sharded over (``SINGLE``: this process runs every row); the
    stacked state holds this process's rows (:attr:`shard`), everything else is the whole cohort's.
    """

    t: int
    draws: Draws
    nodes: list[str]
    weights: torch.Tensor
    lr_client: float
    lr_server: float
    rows: ClientBank
    keys: RowKeys | None
    tally: Tally
    timeline: Timeline | None = None  # the simulated queue of ``server_order: arrival``
    group: Group = SINGLE

    @property
    def shard(self) -> Shard:
        """The rows this process trains: a contiguous block of the cohort (all of it in one process)."""
        return self.group.share(len(self.draws))

    def state(self, subset: torch.Tensor | None) -> State:
        """The stacked state of the rows ``subset`` (all rows for None)."""
        bank = self.rows
        full = (bank.params, bank.buffers, bank.opt_state)
        return full if subset is None else tuple(rows(t, subset) for t in full)

    def keep(self, subset: torch.Tensor | None, state: State) -> None:
        """Write back the state of the rows ``subset`` (all rows for None)."""
        if subset is None:
            self.rows.adopt(*state, owned=False)
            return
        for full, part in zip((self.rows.params, self.rows.buffers, self.rows.opt_state), state, strict=True):
            for name, value in part.items():
                full[name] = full[name].index_put((subset,), value)


class SplitLearning(Algorithm):
    """Base of the split family: the round; subclasses build their client side and server part."""

    cfg: SplitConfig
    state_fields = ("client", "server", "local_aux", "totals")

    def __init__(self, ctx: Context, cfg: SplitConfig):
        super().__init__(ctx, cfg)
        self.rows_per_round = check_participation(
            cfg.participation, cfg.clients_per_round, ctx.data.num_clients
        )
        if cfg.agg_every is not None and cfg.server_order == "client_after_client":
            raise ConfigError("algorithm.agg_every", "needs server_order round_robin or random")
        client_opt, server_opt = cfg.optimizer, cfg.server_optimizer or cfg.optimizer
        self.client_sgd = make_optimizer(client_opt)
        self.server_sgd = make_optimizer(server_opt)
        self.clients = self.client_side()
        self.parts = self.clients.parts
        client, client_buffers, server, server_buffers = initial_state(self.parts, cfg.init, ctx.seed)
        self.client = {"params": client, "buffers": client_buffers}
        self.server = self.server_part(server, server_buffers)
        if cfg.server_order == "arrival" and not self.server.in_turn:
            raise ConfigError("algorithm.server_order", "arrival orders one shared server model's queue")
        self.local_aux: dict[int, Tensors] = {}  # each client's own aux head when it is not averaged
        self.totals = {"uploads": 0, "server_steps": 0}
        self.up, self.down = ctx.network.link(cfg.codec_up), ctx.network.link(cfg.codec_down)
        # labels are integers: a dense float codec carries them exactly, a lossy one would corrupt them
        self.labels = self.up if isinstance(self.up.codec, FloatCodec) else ctx.network.link("fp32")
        self.flops = count_flops(self.parts)
        self._hold(self.rows_per_round, [])

    # ----- what an algorithm chooses ----------------------------------------------------------------

    @abstractmethod
    def client_side(self) -> ClientSide:
        """The participants' local step (built on :func:`build_parts` with or without an aux head)."""

    @abstractmethod
    def server_part(self, params: Tensors, buffers: Tensors) -> SplitServer:
        """The server side, starting from the initial server model."""

    def uploads_at(self, step: int) -> bool:
        """Whether local step ``step`` (0-based in the round) talks to the server."""
        return True

    def step_limits(self, t: int, plan: BatchPlan) -> BatchPlan:
        """The round's plan after algorithm-specific cuts (CSE-FSL drops incomplete upload blocks)."""
        return plan

    def server_pass(self, rnd: Round, exchange: Callable[..., Served]) -> tuple[State, np.ndarray]:
        """Server work before the local steps (CSE-FSL's every-l-rounds pass): the new state of this
        process's rows and the samples each row of the round computed on. None here."""
        return rnd.state(None), np.zeros(len(rnd.draws))

    # ----- the round ---------------------------------------------------------------------------------

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

    def run_round(self, t: int) -> RoundReport:
        rnd = self._begin(t)
        cfg, data, count = self.cfg, self.ctx.data, len(rnd.draws)
        plan = round_plan(
            data, rnd.draws, t, cfg.batch_size, cfg.local_epochs, cfg.local_steps, cfg.drop_last
        )
        every_row = torch.arange(count, device=self.ctx.device)
        state, samples = self.server_pass(rnd, lambda *args: self._exchange(rnd, every_row, *args))
        rnd.keep(None, state)
        rnd.tally.client_samples += samples
        plan = self.step_limits(t, plan)
        one_by_one = cfg.server_order == "client_after_client"
        for subset in every_row.split(1) if one_by_one else [None]:
            self._local_steps(rnd, plan, subset)
        self._aggregate(rnd)
        self._add_up_losses(rnd)
        self._hold(count, rnd.nodes)
        self._advance_clock(rnd)
        return self._report(rnd)

    def sharding(self, count: int) -> Group:
        """The processes a round of ``count`` rows is sharded over (docs/scale-out.md): the run's group, or
        ``SINGLE`` (every process runs the whole round) with ``server_order: client_after_client``, where
        one shared model learns from each client's whole run in turn so that every process would wait
        for the clients of the processes before it, and in a round with fewer rows than processes."""
        group = self.ctx.group
        if group.distributed and self.cfg.server_order != "client_after_client" and count >= group.size:
            return group
        return SINGLE

    def _begin(self, t: int) -> Round:
        """Round ``t``'s participants with the global client model broadcast to them; every process draws
        the same cohort and noise keys and holds the state of its own rows."""
        ctx, cfg = self.ctx, self.cfg
        m = ctx.data.num_clients
        draws = draw(ctx.seed, t, m, cfg.participation, cfg.clients_per_round, cfg.duplicates)
        sizes = ctx.data.client_sizes(draws.clients)
        weights = aggregation_weights(draws, sizes, cfg.aggregation, cfg.aggregate_divisor, m)
        lr_client, lr_server = self.learning_rates(t)
        group = self.sharding(len(draws))
        mine = group.share(len(draws)).take(draws.clients)
        rows = ClientBank(tuple(int(c) for c in mine), {})
        keys = ctx.executor.phase_keys(draws.clients)
        rnd = Round(
            t, draws, nodes.clients(draws.clients), weights.to(ctx.device), lr_client, lr_server, rows, keys,
            Tally.zeros(len(draws), ctx.device), group=group,
        )  # fmt: skip
        self.parts.model.train()
        self.parts.local.train()
        self._download(rnd)
        if cfg.server_order == "arrival":
            down = ctx.system.download(draws.clients, rnd.tally.down_bits, t)
            rnd.timeline = Timeline.start(down.seconds, rnd.tally.down_bits)
        opt_state = stack_copies(self.client_sgd.init(self.client["params"]), len(mine))
        rows.adopt(rows.params, rows.buffers, opt_state, owned=False)
        return rnd

    def _add_up_losses(self, rnd: Round) -> None:
        """On several processes, the rows' training losses (and the server copies' losses) are known only
        where the rows trained: one all-reduce adds them up. Other processes contribute zeros for a row,
        so each row's figures come out exact; the copies' loss total is a sum of per-process sums."""
        if not rnd.group.distributed:
            return
        tally = rnd.tally
        figures = {"loss_sum": tally.loss_sum, "loss_steps": tally.loss_steps}
        if not self.server.in_turn:
            figures["server_loss"] = torch.tensor([tally.server_loss], dtype=torch.float64)
        summed = rnd.group.sum_tensors(figures)
        tally.loss_sum, tally.loss_steps = summed["loss_sum"], summed["loss_steps"]
        if not self.server.in_turn:
            tally.server_loss = float(summed["server_loss"][0])

    def _advance_clock(self, rnd: Round) -> None:
        """The round's simulated latency and energy from its per-row bits and samples (per row, not per
        node: a client drawn twice is two participants on the clock)."""
        tally, system, clients, timeline = rnd.tally, self.ctx.system, rnd.draws.clients, rnd.timeline
        server = training_flops(self.flops.server, tally.server_samples)
        client = self._client_flops(tally.client_samples)
        work = SplitWork(clients, tally.up_bits, tally.down_bits, client, server)
        if timeline is None:
            system.charge(split_round(system, rnd.t, work, self.server.in_turn))
            return
        unplaced = SplitWork(
            clients, tally.up_bits - timeline.up_bits, tally.down_bits - timeline.down_bits,
            self._client_flops(tally.client_samples - timeline.computed), np.zeros(len(clients)),
        )  # fmt: skip
        system.charge(arrival_round(system, rnd.t, work, unplaced, timeline.ready, timeline.server_free))

    def _client_flops(self, samples: np.ndarray) -> np.ndarray:
        """Training FLOPs of the client side (trunk and aux head) over ``samples`` samples per row."""
        return training_flops(self.flops.trunk + self.flops.aux, samples)

    def _report(self, rnd: Round) -> RoundReport:
        """The round's training loss and traffic figures; the run's totals move on."""
        tally = rnd.tally
        self.totals["uploads"] += tally.uploads
        self.totals["server_steps"] += tally.uploads
        figures = {
            "server_loss": tally.server_loss / max(tally.uploads, 1),
            "participants": len(rnd.draws),
            "uploads": tally.uploads,
            "uploads_total": self.totals["uploads"],
            "server_steps_total": self.totals["server_steps"],
            "lr": rnd.lr_client,
        }
        if rnd.timeline is not None:
            figures["queue_wait_s"] = float(rnd.timeline.wait.sum())
        return RoundReport(tally.mean_loss(rnd.weights), figures)

    def _local_steps(self, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None) -> None:
        """Every local step of the rows ``subset`` (all rows for None), with its server traffic.

        Sharded over processes, this process steps its own rows (``rnd.shard``); every process walks the
        whole plan, so all of them reach each step's exchange and know every row's sample counts.
        """
        data = self.ctx.data
        index, weight = (
            (plan.index, plan.weight) if subset is None else (plan.index[subset], plan.weight[subset])
        )
        row_ids = torch.arange(index.shape[0], device=index.device) if subset is None else subset
        keys = rnd.keys if rnd.keys is None or subset is None else rnd.keys.rows(subset)
        mine = rnd.shard.rows if subset is None else slice(None)
        own_ids, own_keys = row_ids[mine], None if keys is None else RowKeys(keys.base[mine])
        state = rnd.state(subset)
        for s in range(index.shape[1]):
            every = weight[:, s]
            counts = (every > 0).sum(dim=1)
            if not bool(counts.any()):
                continue
            x, y = data.x_train[index[mine, s]], data.y_train[index[:, s]]

            def exchange(z: torch.Tensor, grad_z: bool, y=y, counts=counts, s=s) -> Served:
                server_keys = None if keys is None else keys.at(s, SERVER_STAGE)
                return self._exchange(rnd, row_ids, z, y, counts, s, grad_z, server_keys, subset)

            client_keys = None if own_keys is None else own_keys.at(s)
            upload, own = self.uploads_at(s), counts[mine]
            if bool(own.any()):
                batch = (x, y[mine], every[mine])
                step = self.clients.step(state, batch, own, rnd.lr_client, client_keys, exchange, upload)
            else:  # sharded: this process's rows idle at this step while others' step
                step = self.clients.idle(state, index.shape[2], exchange, upload)
            state = step.state
            rnd.tally.computed(row_ids, counts)
            rnd.tally.trained(own_ids, own, step.loss)
            if (
                self.cfg.agg_every is not None
                and (s + 1) % self.cfg.agg_every == 0
                and s + 1 < index.shape[1]
            ):
                rnd.keep(subset, state)
                self._aggregate(rnd)
                self._download(rnd)
                state = rnd.state(subset)
        rnd.keep(subset, state)

    def queue_order(self, t: int, step: int, senders: list[int]) -> list[int]:
        """The order in which one shared server model takes a step's uploads (CSE-FSL Sec. II-E)."""
        if self.cfg.server_order != "random" or len(senders) < 2:
            return senders
        perm = numpy_rng(self.ctx.seed, "server-order", t, step).permutation(len(senders))
        return [senders[i] for i in perm]

    def _exchange(
        self,
        rnd: Round,
        row_ids: torch.Tensor,
        z: torch.Tensor,
        y: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        grad_z: bool,
        keys: torch.Tensor | None = None,
        subset: torch.Tensor | None = None,
    ) -> Served:
        """Upload a step's smashed data and labels, let the server serve them, return its answer with the
        cut-layer gradients as the clients receive them (zero for rows that sent nothing).

        ``row_ids`` are the exchange's rows of the round, ``y``, ``counts`` and ``keys`` theirs; ``z`` holds
        this process's share of them (:attr:`Round.shard`; all of them in one process), and the answer
        is for that share. Sends are sharded (:func:`~fedge.distributed.send_shard`), so every process
        records the whole exchange in the ledger and knows every row's bits.
        """
        t, tally = rnd.t, rnd.tally
        shard = rnd.shard if subset is None else balanced(len(row_ids), 0, 1)
        mine, lengths = shard.rows, counts[shard.rows]
        senders = [rnd.nodes[int(r)] for r in row_ids]
        group, server = rnd.group, nodes.SERVER
        smashed = send_shard(
            group, self.up, t, senders, server, "smashed_up", {"z": z.detach()}, shard, lengths=lengths
        )
        labels = send_shard(
            group, self.labels, t, senders, server, "labels_up", {"y": y[mine]}, shard, lengths=lengths
        )
        at = row_ids.cpu().numpy()
        np.add.at(tally.up_bits, at, smashed.bits + labels.bits)
        np.add.at(tally.server_samples, at, counts.cpu().numpy())
        sending = torch.nonzero(counts > 0).flatten().tolist()
        order, finish = self.queue_order(t, step, sending), None
        if rnd.timeline is not None:
            bits = (smashed.bits + labels.bits)[sending]
            queued, finish = self._arrivals(rnd, rnd.timeline, at[sending], bits, counts, sending)
            order = [sending[i] for i in queued]
        batch = CutBatch(subset, smashed.payload["z"], y, counts, keys)
        served = self._serve(rnd, batch, shard, grad_z, order)
        tally.uploads += len(sending)
        if not grad_z:
            return served
        grads = send_shard(
            group, self.down, t, server, senders, "grad_down", {"g": served.grad_z}, shard, lengths=lengths
        )
        np.add.at(tally.down_bits, at, grads.bits)
        if rnd.timeline is not None and finish is not None:
            back = grads.bits[sending]
            received = self.ctx.system.download(rnd.draws.clients[at[sending]], back, t).seconds
            rnd.timeline.ready[at[sending]] = finish + received
            rnd.timeline.down_bits[at[sending]] += back
        return Served(served.loss, grads.payload["g"])

    def _serve(self, rnd: Round, batch: CutBatch, shard: Shard, grad_z: bool, order: list[int]) -> Served:
        """The server's answer to rows ``shard`` of ``batch`` (whose ``z`` holds only those rows); its loss
        enters the round's tally.

        One shared model must take every row in queue order: the processes' smashed rows are gathered
        (rank order is row order) and every process takes the same server steps on the same batch, so
        the model stays identical everywhere without a broadcast, and a process then keeps its own rows'
        answer (a single serving rank would take as long, the others waiting at the next collective).
        Server copies are independent: each process serves its own rows' copies.
        """
        mine, shared = shard.rows, self.server.in_turn
        if shared:
            batch = batch._replace(z=rnd.group.gather_rows({"z": batch.z})["z"])
        else:
            keys = None if batch.keys is None else batch.keys[mine]
            batch = batch._replace(y=batch.y[mine], counts=batch.counts[mine], keys=keys)
        served = self.server.serve(batch, rnd.lr_server, grad_z, order)
        rnd.tally.server_loss += float(served.loss.sum())
        if not shared:
            return served
        return Served(served.loss[mine], None if served.grad_z is None else served.grad_z[mine])

    def _arrivals(
        self,
        rnd: Round,
        timeline: Timeline,
        rows: np.ndarray,
        bits: np.ndarray,
        counts: torch.Tensor,
        sending: list[int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Place one step's uploads (rows ``rows``, ``bits`` each) on the round's ``timeline`` and queue
        them by arrival: their serving order (indices into ``rows``) and finish times."""
        system, t = self.ctx.system, rnd.t
        samples = counts.cpu().numpy()[sending].astype(np.float64)
        pending = rnd.tally.client_samples[rows] + samples - timeline.computed[rows]
        timeline.computed[rows] += pending
        timeline.up_bits[rows] += bits
        compute = system.client_compute(self._client_flops(pending)).seconds
        upload = system.upload(rnd.draws.clients[rows], bits, t).seconds
        jitter = numpy_rng(self.ctx.seed, "arrival-jitter", t, timeline.exchanges).uniform(
            0.0, self.cfg.arrival_jitter_s, len(rows)
        )
        arrival = timeline.arrive(rows, compute, upload, jitter)
        service = system.server_compute(training_flops(self.flops.server, samples)).seconds
        return timeline.serve(rows, arrival, service)

    def _exchanged(self) -> list[tuple[str, Part]]:
        """The parts of the client model that travel, by name: the trunk, and the aux head if shared."""
        parts: list[tuple[str, Part]] = [("model", trunk_only)]
        return [*parts, ("aux", aux_only)] if self.clients.shares_aux else parts

    def _download(self, rnd: Round) -> None:
        """Broadcast the global client model (and aux head) to every row; start the server's period.

        Unshared aux heads stay on their clients: each row starts from its client's own head (the
        initial one on a first visit) and nothing about them is sent. Every process sends the whole
        broadcast (one encoding for all rows) and stacks its own rows.
        """
        params, buffers = self.client["params"], self.client["buffers"]
        received: Tensors = {}
        for name, part in self._exchanged():
            sent = {**part(params), **floating(part(buffers))}
            if sent:
                down = self.down.send(rnd.t, nodes.SERVER, rnd.nodes, f"{name}_down", sent)
                rnd.tally.down_bits += down.bits[0]
                received.update(down.payload)
        mine = rnd.shard.take(rnd.draws.clients)
        count = len(mine)
        stacked = stack_copies({k: received.get(k, v) for k, v in params.items()}, count)
        if not self.clients.shares_aux:
            for name in aux_only(params):
                own = [self.local_aux.get(int(c), params)[name] for c in mine]
                stacked[name] = torch.stack(own)
        rnd.rows.adopt(
            stacked, stack_copies({k: received.get(k, v) for k, v in buffers.items()}, count), owned=False
        )
        self.server.begin(count)

    def _aggregate(self, rnd: Round) -> None:
        """Upload every row's client model, average it (and the server copies) with the round weights.

        The new global client model is ``old + global_lr * (average - old)`` (the SplitFed convergence
        paper's eta_g; 1 is the plain average). Unshared aux heads are kept per client (the mean of its
        rows' heads). Sharded, each process uploads and sums its own rows and one all-reduce adds the
        sums (as FedAvg); the unshared aux heads are gathered, so every process keeps every client's.
        """
        group, shard = rnd.group, rnd.shard
        uploaded: Tensors = {}
        for name, part in self._exchanged():
            sent = {**part(rnd.rows.params), **floating(part(rnd.rows.buffers))}
            if sent:
                up = send_shard(group, self.up, rnd.t, rnd.nodes, nodes.SERVER, f"{name}_up", sent, shard)
                rnd.tally.up_bits += up.bits
                uploaded.update(up.payload)
        params = {k: uploaded.get(k, v) for k, v in rnd.rows.params.items()}
        buffers = {k: uploaded.get(k, v) for k, v in rnd.rows.buffers.items()}
        weights = rnd.weights[shard.rows]
        average = group.sum_tensors({**weighted_sum(params, weights), **weighted_sum(buffers, weights)})
        old, step = self.client["params"], self.cfg.global_lr
        new_params = {k: average[k] if step == 1.0 else old[k] + step * (average[k] - old[k]) for k in params}
        if not self.clients.shares_aux:
            heads = aux_only(params)
            heads = group.gather_rows(heads) if heads else heads
            for client in np.unique(rnd.draws.clients):
                mine = torch.as_tensor(np.flatnonzero(rnd.draws.clients == client), device=self.ctx.device)
                self.local_aux[int(client)] = {k: heads[k][mine].mean(dim=0) for k in heads}
            new_params.update(aux_only(old))
        self.client = {"params": new_params, "buffers": {k: average[k] for k in buffers}}
        self.server.aggregate(weights / rnd.weights.sum(), group)

    def _hold(self, count: int, participants: list[str]) -> None:
        """Server: its model(s) and the ``count`` client uploads it averages; participants: trunk, aux."""
        network = self.ctx.network
        params, buffers = self.client["params"], self.client["buffers"]
        network.hold(nodes.SERVER, "server_model", self.server.storage_bits(count))
        trunk_bits = state_bits({**trunk_only(params), **trunk_only(buffers)})
        aux_bits = state_bits({**aux_only(params), **aux_only(buffers)})
        uploaded = trunk_bits + (aux_bits if self.clients.shares_aux else 0)
        network.hold(nodes.SERVER, "client_models", count * uploaded)
        network.hold(participants, "model", trunk_bits)
        if aux_bits:
            network.hold(participants, "aux", aux_bits)

    # ----- evaluation --------------------------------------------------------------------------------

    def evaluate(self) -> Evaluation:
        """The composed model (averaged trunk + server model) on the global test set; with a shared aux
        head also the accuracy of trunk + aux head. On several processes each scores a block of the test
        rows (:func:`~fedge.distributed.evaluate.evaluate_sharded`)."""
        data, batch, group = self.ctx.data, self.ctx.config.eval.batch_size, self.ctx.group
        client = self.client
        server_params, server_buffers = self.server.evaluation_model()
        params = composed(client["params"], server_params)
        buffers = composed(client["buffers"], server_buffers)
        evaluation = evaluate_sharded(
            group, self.parts.model, params, buffers, data.x_test, data.y_test, batch
        )
        if self.clients.has_aux and self.clients.shares_aux:
            aux = evaluate_sharded(
                group, self.parts.local, client["params"], client["buffers"], data.x_test, data.y_test, batch
            )
            evaluation = evaluation.with_extra(aux_accuracy=aux.accuracy, aux_loss=aux.loss)
        return evaluation


class GradientReturn(SplitLearning):
    """SplitFed's clients (v1 and v2): cut-layer gradients come back and are back-propagated."""

    cfg: GradientReturnConfig

    def client_side(self) -> ClientSide:
        parts = build_parts(self.ctx, with_aux=False)
        return GradientClients(parts, self.client_sgd, self.ctx.executor, self.cfg.clip_norm)


class LocalLoss(SplitLearning):
    """Aux-head clients (FSL_AN, CSE-FSL): they learn from their local loss; nothing comes back."""

    cfg: AuxHeadConfig

    def client_side(self) -> ClientSide:
        cfg, parts = self.cfg, build_parts(self.ctx, with_aux=True)
        post_step = cfg.smashed_from == "post_step"
        return AuxHeadClients(parts, self.client_sgd, self.ctx.executor, post_step, cfg.aggregate_aux)
