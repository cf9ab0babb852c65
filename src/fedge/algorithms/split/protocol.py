"""The split-learning round, written once for SplitFed v1/v2, FSL_AN and CSE-FSL.

A round (the SplitFed convergence paper's Algorithm 1 with partial participation; CSE-FSL Sec. II-III):
draw the participants; broadcast the averaged client model (and aux head); run the local steps, each the
client side's (:mod:`~fedge.algorithms.split.clients`) with its exchange with the server
(:mod:`~fedge.algorithms.split.exchange`: smashed data and labels up, for SplitFed the cut-layer gradient
down, served in the order of the run's :mod:`~fedge.algorithms.split.order` policy); then upload the
client models and average them (:mod:`~fedge.algorithms.split.client_model`). The server side is a part
(:mod:`~fedge.algorithms.split.server`): a copy per participant or one shared model. An algorithm is the
choice of its client kind (:class:`GradientReturn`: SplitFed's clients back-propagate the cut-layer
gradients the server returns; :class:`LocalLoss`: aux-head clients learn from a local loss and get nothing
back) and server part plus, for CSE-FSL, when to upload; the round's cost is read off its tally
(:mod:`~fedge.algorithms.split.cost`).

Storage: the server holds its model(s) (``server_model``) and the uploaded client models it averages
(``client_models``); each participant its trunk and aux head.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import numpy as np
import torch

from fedge.aggregation import sites
from fedge.aggregation.fltrust import FLTrust
from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.optimizer_state import ClientOptimizerStates
from fedge.algorithms.split.client_model import ClientModels, Part, evaluate_split
from fedge.algorithms.split.clients import AuxHeadClients, ClientSide, GradientClients, State
from fedge.algorithms.split.config import SPLIT_BATCHED_FROM, AuxHeadConfig, GradientReturnConfig, SplitConfig
from fedge.algorithms.split.copies import ServerCopies
from fedge.algorithms.split.cost import count_flops, round_cost
from fedge.algorithms.split.exchange import ServerExchange
from fedge.algorithms.split.order import server_order
from fedge.algorithms.split.participation import Draws, check_participation, participants
from fedge.algorithms.split.parts import build_parts, initial_state
from fedge.algorithms.split.plans import round_plan, step_sizes
from fedge.algorithms.split.privacy import CutPrivacy, sent_indices
from fedge.algorithms.split.private_step import SampleDP
from fedge.algorithms.split.root import split_root_update
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import SplitServer
from fedge.algorithms.split.steps import LocalSteps
from fedge.algorithms.split.tally import Tally
from fedge.comm import nodes
from fedge.config import RunConfig
from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine import make_optimizer
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.runtime.availability import online_clients
from fedge.runtime.split import SplitRuntime
from fedge.runtime.split_adversary import SplitAdversary
from fedge.system import RoundCost
from fedge.tensors import Tensors


class SplitLearning(Algorithm[SplitConfig]):
    """Base of the split family: the round; subclasses build their client side and server part."""

    state_fields: tuple[str, ...] = ("client", "server", "local_aux", "totals")
    batched_from = SPLIT_BATCHED_FROM
    exchange_class: ClassVar[type[ServerExchange]] = ServerExchange
    """How the cut layer's uploads reach the server: served at once (a subclass may collect them)."""

    @classmethod
    def clients_per_step(cls, config: RunConfig) -> int:
        """Client after client, a step trains one client; otherwise every participant."""
        algorithm = config.algorithm
        if isinstance(algorithm, SplitConfig) and algorithm.server_order == "client_after_client":
            return 1
        return super().clients_per_step(config)

    def reads_run_length(self) -> str | None:
        return None  # no round reads config.rounds

    def __init__(self, ctx: Context, cfg: SplitConfig):
        super().__init__(ctx, cfg)
        self.runtime = SplitRuntime(ctx)
        m = ctx.data.num_clients
        self.rows_per_round = check_participation(cfg.participation, cfg.clients_per_round, m)
        if cfg.agg_every is not None and cfg.server_order == "client_after_client":
            raise ConfigError("algorithm.agg_every", "needs server_order round_robin or random")
        if cfg.nopeek > 0 and not ctx.data.x_train.is_floating_point():
            raise ConfigError("algorithm.nopeek", "needs real-valued inputs; this data set's are token ids")
        self.client_sgd = make_optimizer(cfg.optimizer)
        self.client_opt = ClientOptimizerStates(self.client_sgd, cfg.client_optimizer_state == "keep")
        if self.client_opt.keep:  # the kept states travel in the checkpoint; reset runs' stay as they were
            self.state_fields = (*self.state_fields, "client_opt")
        self.server_sgd = make_optimizer(cfg.server_optimizer or cfg.optimizer)
        self.cut_privacy = CutPrivacy.of(ctx)  # privacy.cut / privacy.labels (None: neither is set)
        if self.cut_privacy is not None:  # which clients' labels went out travels in the checkpoint
            self.state_fields = (*self.state_fields, "cut_privacy")
        self.clients = self.client_side()
        self.sample_privacy = SampleDP.of(ctx)  # privacy.sample: every client update is DP-SGD
        if self.sample_privacy is not None:
            self.clients.privatize(self.sample_privacy.clip)
        self.parts = self.clients.parts
        client, client_buffers, server, server_buffers = initial_state(self.parts, cfg.init, ctx.seed)
        self.client = {"params": client, "buffers": client_buffers}
        self.server = self.server_part(server, server_buffers)
        if cfg.server_order == "arrival" and not self.server.sequential:
            raise ConfigError("algorithm.server_order", "arrival orders one shared server model's queue")
        self.local_aux: dict[int, Tensors] = {}  # each client's own aux head when it is not averaged
        self.totals = {"uploads": 0, "server_steps": 0}
        self.flops = count_flops(self.parts)
        order = server_order(cfg.server_order, ctx.system, ctx.seed, cfg.arrival_jitter_s, self.flops)
        codecs = (cfg.codec_up, cfg.codec_down)
        padded = self.parts.model.pad_id is not None
        self.exchange = self.exchange_class(self.runtime, codecs, self.server, order, padded)
        self.exchange.privacy = self.cut_privacy
        self.up, self.down = ctx.network.link(cfg.codec_up), ctx.network.link(cfg.codec_down)
        self.models = ClientModels(
            self.runtime, self.up, self.down, self.clients.shares_aux, cfg.global_lr, ctx.device
        )
        self.local_steps = LocalSteps(ctx.data, self.clients, self.exchange, self.uploads_at, cfg.agg_every,
                                      self._synchronise)  # fmt: skip
        if self.cut_privacy is not None:
            self.local_steps.sent_labels = self.cut_privacy.sent_labels
        self.local_steps.sample = self.sample_privacy
        self.adversary = SplitAdversary.of_run(ctx)  # the adversary block: at the cut and the client models
        self.trust = self._trust()  # an fltrust server reducer, trained a root update before each average
        self.averages = (0, 0)  # (round, client-model averages so far in it): keys the root batches
        self.exchange.adversary = self.local_steps.adversary = self.models.adversary = self.adversary
        self.hold_storage(self.rows_per_round, [])

    def _trust(self) -> FLTrust | None:
        """The server's ``fltrust`` reducer, if any; refused where the server's copies go through the
        same pipeline (SplitFed v1, FSL_AN), since no root update of the server part is trained."""
        reducer = self.ctx.pipeline(sites.SERVER).reducer
        if not isinstance(reducer, FLTrust):
            return None
        if isinstance(self.server, ServerCopies):
            copies = f"fltrust needs the server's root update; {self.cfg.name} has none for its server copies"
            raise ConfigError(f"{reducer.run.key}.name", copies)
        return reducer

    def most_batches(self) -> int:
        """The most local batches any client has in one round (``local_steps``, or epochs x batches)."""
        cfg = self.cfg
        if cfg.local_steps is not None:
            return cfg.local_steps
        sizes = self.ctx.data.client_sizes()
        per_epoch = sizes // cfg.batch_size if cfg.drop_last else -(-sizes // cfg.batch_size)
        return int(per_epoch.max(initial=0)) * cfg.local_epochs

    # ----- what an algorithm chooses ----------------------------------------------------------------

    @property
    def smashed_clip(self) -> float | None:
        """The per-sample L2 bound on the smashed data (``privacy.cut.clip``; None: sent as computed)."""
        return None if self.cut_privacy is None else self.cut_privacy.smashed_clip

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

    def cut_sends(self, rnd: Round, plan: BatchPlan) -> tuple[np.ndarray, np.ndarray]:
        """The samples each row of round ``rnd`` sends across the cut (smashed data and labels) and those
        whose cut gradient comes back, ``[rows, ...]`` padded with -1, read off the plan and the upload
        schedule (an extension point: CSE-FSL adds its server-pass batch)."""
        steps = [s for s in range(plan.index.shape[1]) if self.uploads_at(s)]
        sent = sent_indices(plan.index, plan.weight, steps)
        return sent, sent if self.clients.returns_gradient else sent[:, :0]

    def sample_uses(self, rnd: Round, plan: BatchPlan) -> np.ndarray:
        """The samples each row of round ``rnd`` computes a client update on, ``[rows, ...]`` padded with
        -1: every step of the plan (an extension point: CSE-FSL adds its server-backprop batch)."""
        return sent_indices(plan.index, plan.weight, list(range(plan.index.shape[1])))

    def record_cut(self, rnd: Round, plan: BatchPlan) -> None:
        """Record the round's releases at the cut and those of DP-SGD in the client steps (counted
        exactly: see :mod:`~fedge.algorithms.split.privacy`)."""
        if self.cut_privacy is None and self.sample_privacy is None:
            return
        sends = self.cut_sends(rnd, plan)
        if self.cut_privacy is not None:
            self.cut_privacy.begin(rnd.t, rnd.draws.clients)
            self.cut_privacy.record(rnd.t, rnd.draws.clients, *sends)
        if self.sample_privacy is not None:
            self.sample_privacy.begin(rnd.t, rnd.draws.clients)
            self.sample_privacy.record(rnd.t, rnd.draws.clients, self.sample_uses(rnd, plan), sends[0])

    def server_pass(self, rnd: Round) -> tuple[State, np.ndarray]:
        """Server work before the local steps (CSE-FSL's every-l-rounds pass): the new state of this
        process's rows and the samples each row of the round computed on. None here."""
        return rnd.state(None), np.zeros(len(rnd.draws))

    # ----- the round ---------------------------------------------------------------------------------

    def run_round(self, t: int) -> RoundReport:
        online = self.online(t)
        if online is not None and not len(online):  # nobody online: the models and the clock stay
            return RoundReport(0.0, {"participants": 0, "uploads": 0})
        rnd = self.begin(t)  # draw the participants, broadcast the client model
        state, samples = self.server_pass(rnd)
        rnd.write_back(None, state)
        rnd.tally.client_samples += samples
        plan = self.plan(rnd)
        self.record_cut(rnd, plan)
        for subset in self.exchange.order.passes(len(rnd.draws), self.ctx.device):
            self.local_steps(rnd, plan, subset)  # local steps, each with its server exchange
        self.client_opt.end(rnd.draws.clients, rnd.rows.opt_state, rnd.cohort)  # kept for the next visit
        self.aggregate_models(rnd)  # upload and average the client models (and server copies)
        rnd.tally.add_up(self.runtime, rnd.cohort, server_losses=not self.server.sequential)
        self.hold_storage(len(rnd.draws), rnd.nodes)
        self.runtime.close(self.round_cost(rnd))
        return self.round_report(rnd)

    def round_cost(self, rnd: Round) -> RoundCost:
        """Round ``rnd``'s latency and energy on the simulated clock, read off its tally."""
        return round_cost(self.ctx.system, rnd, self.flops, self.server.sequential)

    def learning_rates(self, t: int) -> tuple[float, float]:
        """Client and server step sizes in round t (:func:`~fedge.algorithms.split.plans.step_sizes`)."""
        return step_sizes(self.cfg, t, self.ctx.data.num_clients)

    def training(self, t: int) -> FederatedData:
        """The data round ``t``'s rows train on: the malicious clients' view once they attack (flipped
        labels, or a backdoor's stamped copies, which the round's plan then indexes), else the run's."""
        return self.ctx.data if self.adversary is None else self.adversary.data(t, self.ctx.data)

    def plan(self, rnd: Round) -> BatchPlan:
        """The round's local steps: every row's batches, after the algorithm's cuts."""
        cfg = self.cfg
        data = self.training(rnd.t)
        plan = round_plan(data, rnd.draws, rnd.t, cfg.batch_size, cfg.local_epochs, cfg.local_steps,
                          cfg.drop_last)  # fmt: skip
        return self.step_limits(rnd.t, plan)

    def begin(self, t: int) -> Round:
        """Round ``t``'s participants with the global client model broadcast to them; every process draws
        the same cohort and noise keys and holds the state of its own rows."""
        online = self.online(t)
        return self.start(t, *participants(self.ctx.seed, t, self.ctx.data, self.cfg, online))

    def online(self, t: int) -> np.ndarray | None:
        """The clients online in round ``t``, or None when all are (:mod:`~fedge.runtime.availability`)."""
        return online_clients(self.ctx.system, t)

    def start(self, t: int, draws: Draws, weights: torch.Tensor) -> Round:
        """A round ``t`` of the rows ``draws`` (aggregation ``weights``), the client model broadcast."""
        ctx = self.ctx
        cohort = self.exchange.order.cohort(ctx.cohorts, len(draws))
        rows = self.runtime.bank(cohort, draws.clients)
        rnd = Round(
            t, draws, nodes.clients(draws.clients), weights.to(ctx.device), *self.learning_rates(t), rows,
            ctx.executor.phase_keys(draws.clients), Tally.zeros(len(draws), ctx.device), cohort,
        )  # fmt: skip
        self.parts.model.train()
        self.parts.local.train()
        self._download(rnd)
        ctx.recorder.model("client_model", self.client["params"], self.client["buffers"])
        self.exchange.begin(rnd)
        opt_state = self.client_opt.start(rows.clients, self.client["params"])
        rows.adopt(rows.params, rows.buffers, opt_state, owned=False)
        return rnd

    def round_report(self, rnd: Round) -> RoundReport:
        """The round's training loss and traffic figures (the queue's and an adversary's too); the run's
        totals move on. An extension point: a variant adds its own figures (FSL-SAGE, a deployed round)."""
        return rnd.report(self.totals, {**self.exchange.order.figures(rnd), **self.models.figures})

    # ----- the client model's way down and up --------------------------------------------------------

    def exchanged_parts(self) -> list[tuple[str, Part]]:
        """The parts of the client model that travel, by name: the trunk, and the aux head if shared
        (what a deployed node sends and receives)."""
        return self.models.parts()

    def _download(self, rnd: Round) -> None:
        """Broadcast the global client model (and aux head) to every row; start the server's period."""
        self.models.download(rnd, self.client, self.local_aux)
        self.server.begin(len(rnd.cohort))

    def aggregate_models(self, rnd: Round) -> None:
        """Upload every row's client model, average it and the server copies with the round weights.
        An extension point: FSL-SAGE aligns its auxiliary models here. An ``fltrust`` server first
        trains its root update (:mod:`~fedge.algorithms.split.root`)."""
        if self.trust is not None:
            k = self.averages[1] if self.averages[0] == rnd.t else 0
            self.averages = (rnd.t, k + 1)
            client, (server, server_buffers) = self.client, self.server.evaluation_model()
            self.trust.root = split_root_update(
                self.ctx, self.cfg, self.parts, self.trust, self.client_sgd, (rnd.t, k, rnd.lr_client),
                (client["params"], client["buffers"]), {**server, **server_buffers},
            )  # fmt: skip
        self.client = self.models.aggregate(rnd, self.client, self.local_aux)
        self.server.aggregate(
            self.runtime.row_weights(rnd) / rnd.weights.sum(), self.runtime.aggregation(rnd.t, rnd.cohort)
        )

    def _synchronise(self, rnd: Round) -> None:
        """A mid-round averaging (``agg_every``): aggregate, then broadcast the new model."""
        self.aggregate_models(rnd)
        self._download(rnd)

    def hold_storage(self, count: int, participants: list[str]) -> None:
        """Server: its model(s) and the ``count`` client uploads it averages; participants: trunk, aux.
        An extension point: FSL-SAGE adds the server's store of smashed data."""
        self.runtime.store(nodes.SERVER, "server_model", self.server.storage_bits(count))
        self.models.store(self.client, count, participants)

    def evaluate(self) -> Evaluation:
        """The composed model (averaged trunk + server model) on the global test set; with a shared aux
        head also trunk + aux head (:func:`~fedge.algorithms.split.client_model.evaluate_split`); under
        a backdoor the composed model's attack success rate."""
        aux = self.clients.has_aux and self.clients.shares_aux
        server = self.server.evaluation_model()
        return evaluate_split(self.ctx, self.parts, self.client, server, aux, self.adversary)


class GradientReturn(SplitLearning):
    """SplitFed's clients (v1 and v2): cut-layer gradients come back and are back-propagated."""

    cfg: GradientReturnConfig
    recorded = frozenset({"smashed", "cut_gradients", "labels"})

    def client_side(self) -> ClientSide:
        parts = build_parts(self.ctx, with_aux=False)
        cfg = self.cfg
        return GradientClients(
            parts, self.client_sgd, self.ctx.executor, cfg.clip_norm, self.smashed_clip, cfg.nopeek
        )


class LocalLoss(SplitLearning):
    """Aux-head clients (FSL_AN, CSE-FSL): they learn from their local loss; nothing comes back."""

    cfg: AuxHeadConfig
    recorded = frozenset({"smashed", "labels"})  # nothing comes back across the cut

    def client_side(self) -> ClientSide:
        cfg, parts = self.cfg, build_parts(self.ctx, with_aux=True)
        post_step = cfg.smashed_from == "post_step"
        executor, clip = self.ctx.executor, self.smashed_clip
        return AuxHeadClients(
            parts, self.client_sgd, executor, post_step, cfg.aggregate_aux, clip, cfg.nopeek
        )
