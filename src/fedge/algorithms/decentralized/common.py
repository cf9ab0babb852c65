"""What every decentralized algorithm shares: the FedAvg-FT backbone on a peer-to-peer graph.

All n clients hold persistent state in one :class:`~fedge.engine.ClientBank` (row i = client i). A
round trains rows through the run's executor (one call per phase), exchanges models with peers chosen
on the topology, and mixes them with one matrix product (:mod:`fedge.engine.mixing`). Evaluation
fine-tunes a copy of every client's model for ``ft_epochs`` epochs on its own data and tests it on its
own test set (``accuracy`` = unweighted mean over clients, the evaluation of AFIND+'s App. C.3).

Parameters are split into shared and private (AFIND+ Eq. 2: a shared w and a private beta): by default
every layer is shared (the FedAvg-FT backbone the paper's experiments use, App. C.3; docs/decisions.md,
"Shared and private layers"); ``personal="head"`` keeps the last block (the classifier head, found with
:func:`fedge.models.split`) private: it is never sent or mixed.
Local optimizer state is fresh every round (as in FedAvg); every transfer goes through a peer link
(direction "peer"; kinds ``peer_model``, ``model_request``, ``proxy``, ``loss``), each with its codec
(``codec_model``, ``codec_request``, ``codec_proxy`` for proxies and losses). Every client's message
of one kind has the same size (a model's shared part, a proxy vector, a loss), so an exchange is
counted from one client's encoded message on every pair that carries it. With a lossy ``codec_model``
a client mixes its own row exactly and every peer's row as it decodes it (each sender's row encoded with
its own link-derived randomness); requests, proxies and losses are counted at their codec's size while
the selection scores with exact values (their decoding is not modelled). Each round advances the
simulated clock by its compute and the peer traffic it sent (:func:`fedge.system.peer_round`); selection
components see the host through a :class:`~fedge.algorithms.decentralized.view.PeerView`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Annotated, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveInt

from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.decentralized.probes import ProbeBatches, gather, pair_losses, probe_batches
from fedge.algorithms.decentralized.topology import TopologyConfig, build_topology
from fedge.algorithms.decentralized.view import PeerView
from fedge.comm import Link, nodes
from fedge.config import AlgorithmConfig, CodecName, SGDConfig
from fedge.data.federated import FederatedData
from fedge.distributed.evaluate import evaluate_clients_on
from fedge.engine import ClientBank, buffers_of, classification_loss, make_optimizer, make_step, parameters_of
from fedge.engine.mixing import mix
from fedge.engine.personal import fine_tuned
from fedge.engine.step import StepFn
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.models import split
from fedge.rng import numpy_rng
from fedge.system import RoundWork, forward_flops, peer_round
from fedge.tensors import Tensors, floating, rows

Trained = tuple[Tensors, Tensors, torch.Tensor]
"""Trained params, buffers and per-row losses of a set of rows."""
TrainFn = Callable[[Tensors, Tensors, Sequence[int], Tensors | None], Trained]
"""A local update of rows: ``(params, buffers, owners, extra) -> (params, buffers, losses)``."""


def paper_optimizer() -> SGDConfig:
    """SGD with lr 0.01 and momentum 0.9, the AFIND+ paper's optimiser (App. C.3)."""
    return SGDConfig(lr=0.01, momentum=0.9)


class PeerConfig(AlgorithmConfig):
    """Knobs of the FedAvg-FT backbone shared by the whole decentralized family.

    Defaults follow the AFIND+ paper (5 local epochs, SGD lr 0.01 momentum 0.9, 10 peers per round,
    1 fine-tune epoch before evaluation); ``batch_size`` 32 is ours (the paper uses 128 on CIFAR).
    ``codec_model`` encodes the trained models peers receive, ``codec_request`` the models requesters
    send for probing, ``codec_proxy`` proxies and losses (names as ``fedge.config.CodecName``).
    ``local_update="alternating"`` trains the head alone for ``head_epochs`` epochs, then the body for
    the remaining ``local_epochs - head_epochs`` (Algorithm 1's local update, lines 17-23; default: joint
    over all parameters for ``local_epochs``, docs/decisions.md, "Joint or alternating local update").
    """

    local_epochs: PositiveInt = 5
    """passes over the client's data per round"""
    batch_size: PositiveInt = 32
    """samples per local step"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=paper_optimizer)
    """the clients' local optimizer"""
    ft_epochs: NonNegativeInt = 1
    """fine-tuning epochs of each client's copy before it is evaluated"""
    peers: PositiveInt = 10
    """neighbours each client talks to per round"""
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    """the graph of who may talk to whom"""
    personal: Literal["none", "head"] = "none"
    """none, or head: the last block stays private to each client"""
    local_update: Literal["joint", "alternating"] = "joint"
    """joint (all parameters) or alternating (head, then body)"""
    head_epochs: PositiveInt = 1
    """alternating: epochs on the head before the body"""
    probe_size: Annotated[int, Field(ge=1)] | None = None
    """samples of the batch a client probes neighbours on (default: the batch size)"""
    codec_model: CodecName = "fp32"
    """encoding of the models peers send each other"""
    codec_request: CodecName = "fp32"
    """encoding of the models requesters send for probing"""
    codec_proxy: CodecName = "fp32"
    """encoding of gradient proxies and losses"""


def sample_peers(seed: int, purpose: str, round_: int, allowed: np.ndarray, k: int) -> np.ndarray:
    """Boolean ``[n, n]``: ``min(k, |allowed_i|)`` uniform peers per client, stream ``(purpose, t, i)``."""
    chosen = np.zeros_like(allowed, dtype=bool)
    for i, row in enumerate(allowed):
        options = np.flatnonzero(row)
        if len(options):
            take = numpy_rng(seed, purpose, round_, i).choice(
                options, size=min(k, len(options)), replace=False
            )
            chosen[i, take] = True
    return chosen


class PeerAlgorithm(Algorithm):
    """Base of the decentralized family: the client bank, local training, mixing, peer links, evaluation.

    Subclasses implement :meth:`peer_round`; :meth:`run_round` wraps it with the round's work tally and
    the simulated clock.
    """

    cfg: PeerConfig
    state_fields: ClassVar[tuple[str, ...]] = ("round", "bank")

    def __init__(self, ctx: Context, cfg: PeerConfig):
        super().__init__(ctx, cfg)
        if cfg.local_update == "alternating" and cfg.head_epochs >= cfg.local_epochs:
            raise ConfigError("algorithm.head_epochs", "must be below local_epochs in alternating mode")
        self.model = ctx.build_model().to(ctx.device)
        n = ctx.data.num_clients
        self.num_clients = n
        self.train_data: FederatedData = ctx.data  # what local training, probes and fine-tunes draw from
        self.adjacency = build_topology(cfg.topology, n, ctx.seed)
        self.neighbours = torch.as_tensor(self.adjacency, device=ctx.device)
        self.head = self._head_names()
        self.private = self.head if cfg.personal == "head" else set()
        self.sgd = make_optimizer(cfg.optimizer)
        self.step = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        params, buffers = parameters_of(self.model), buffers_of(self.model)
        self.bank = ClientBank.broadcast(range(n), params, buffers)
        self.requests = ctx.network.link(cfg.codec_request)  # models sent for probing
        self.messages = ctx.network.link(cfg.codec_proxy)  # proxies and losses
        self.models: Link = ctx.network.link(cfg.codec_model)  # how trained models travel
        self.round = 0
        self.flops_per_sample = forward_flops(self.model, ctx.data.input_shape)
        self.work = RoundWork(n)
        ctx.network.hold(nodes.clients(range(n)), "model", {**params, **buffers})

    # ----- the round -------------------------------------------------------------------------------
    def run_round(self, t: int) -> RoundReport:
        """Round ``t`` (:meth:`peer_round`), then its compute and peer traffic charged to the clock."""
        self.round = t
        self.work = RoundWork(self.num_clients)
        report = self.peer_round(t)
        flops = self.work.flops(self.flops_per_sample)
        self.ctx.system.charge(peer_round(self.ctx.system, t, flops, self.ctx.network.traffic(t)))
        return report

    @abstractmethod
    def peer_round(self, t: int) -> RoundReport:
        """Train, choose peers, exchange and mix for round ``t``; report its training loss and figures."""

    def view(self) -> PeerView:
        """The narrow view a selection component gets of this host (read at call time)."""
        return PeerView(
            neighbours=self.neighbours,
            seed=self.ctx.seed,
            model=self.model,
            data=self.ctx.data,
            private=frozenset(self.private),
            current=lambda: (self.bank.params, self.bank.buffers),
            shared=self.shared,
            losses_on=self.losses_on,
            random_peers=self.random_peers,
            count_probes=self.count_probes,
            request=self.request_models,
            reply=self.send_models,
            report=self.exchange,
            map_rows=self.map_rows,
        )

    def count_probes(self, clients: torch.Tensor, batches: ProbeBatches, backward: bool) -> None:
        """Tally one pass over their probe batch by each of ``clients`` (backward too if ``backward``)."""
        samples = batches.weight[clients].sum(dim=1)
        self.work.compute(clients.cpu().numpy(), samples.double().cpu().numpy(), backward)

    # ----- parameters -------------------------------------------------------------------------------
    def _head_names(self) -> set[str]:
        """Names of the head block's parameters and buffers (the last block of the split model)."""
        if len(self.model) < 2:
            if self.cfg.personal == "head" or self.cfg.local_update == "alternating":
                raise ConfigError(
                    "algorithm.personal", f"{self.model.name} has one block: no head to split off"
                )
            return set()
        _, head = split(self.model, len(self.model) - 1)
        return set(head.state_dict())

    def shared(self, tensors: Tensors) -> Tensors:
        """The floating tensors that travel (not private, not integer counters)."""
        return {k: v for k, v in floating(tensors).items() if k not in self.private}

    def dense_message(self) -> Tensors:
        """One client's shared model as it is requested or sent dense (client 0's; all are alike)."""
        return self.shared(rows({**self.bank.params, **self.bank.buffers}, 0))

    def model_message(self) -> Tensors:
        """One client's trained model as :attr:`models` sends it (dense here; sparse hosts override)."""
        return self.dense_message()

    def rows(self, index: torch.Tensor | Sequence[int]) -> tuple[Tensors, Tensors]:
        """Copies of the params and buffers of the clients ``index``."""
        index = torch.as_tensor(index, device=self.ctx.device, dtype=torch.long)
        params, buffers = self.bank.params, self.bank.buffers
        return {k: v[index] for k, v in params.items()}, {k: v[index] for k, v in buffers.items()}

    def compose(self, shared_from: torch.Tensor, private_from: torch.Tensor) -> tuple[Tensors, Tensors]:
        """Rows made of ``shared_from``'s shared part and ``private_from``'s private part (copies)."""
        return (
            gather(self.bank.params, self.private, shared_from, private_from),
            gather(self.bank.buffers, self.private, shared_from, private_from),
        )

    def _pair_losses(
        self,
        params: Tensors,
        buffers: Tensors,
        pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        batches: ProbeBatches,
    ) -> torch.Tensor:
        """Probe-batch losses of rows ``(shared_from, private_from, data_from)`` (see ``pair_losses``),
        each a forward pass by the client ``data_from`` whose batch it uses (in this process)."""
        self.count_probes(pairs[2], batches, backward=False)
        return pair_losses(self.model, params, buffers, self.private, pairs, self.ctx.data, batches)

    # ----- training --------------------------------------------------------------------------------
    def train_rows(
        self,
        params: Tensors,
        buffers: Tensors,
        owners: Sequence[int],
        t: int,
        step: StepFn | None = None,
        extra: Tensors | None = None,
        purpose: str = "batches",
    ) -> tuple[Tensors, Tensors, torch.Tensor]:
        """Train rows (row r on client ``owners[r]``'s data) for the round's local epochs, one executor call
        per phase (two in alternating mode). ``extra`` tensors ride along as constants (anchors, masks)."""
        cfg = self.cfg
        self.model.train()
        if cfg.local_update == "joint":
            return self._train(
                params, buffers, owners, t, cfg.local_epochs, set(params), step, extra, purpose
            )
        params, buffers, _ = self._train(
            params, buffers, owners, t, cfg.head_epochs, self.head, step, extra, f"{purpose}-head"
        )
        body = set(params) - self.head
        epochs = cfg.local_epochs - cfg.head_epochs
        return self._train(params, buffers, owners, t, epochs, body, step, extra, purpose)

    def local_update(
        self,
        params: Tensors,
        buffers: Tensors,
        owners: Sequence[int],
        t: int,
        extra: Tensors | None = None,
        train: TrainFn | None = None,
    ) -> tuple[Tensors, Tensors, torch.Tensor]:
        """The round's local update of rows (row r on client ``owners[r]``'s data): :meth:`train_rows`,
        or ``train(params, buffers, owners, extra)`` (Ditto's personal models).

        The rows are a cohort (:meth:`map_rows`): each process trains its rows (and their per-row
        ``extra`` constants) and every process gets every trained row and loss, in row order, and the
        whole round's compute tally. Noise keys and batch plans are per client, so a row trains as it
        would in one process.
        """
        train = train or (lambda p, b, o, e: self.train_rows(p, b, o, t, extra=e))

        def mine(rows: slice) -> Tensors:
            def take(tensors: Tensors) -> Tensors:
                return {k: v[rows] for k, v in tensors.items()}

            new_p, new_b, losses = train(
                take(params), take(buffers), list(owners)[rows], None if extra is None else take(extra)
            )
            return {**new_p, **new_b, "\0loss": losses}

        trained = self.map_rows(len(owners), mine)
        return {k: trained[k] for k in params}, {k: trained[k] for k in buffers}, trained["\0loss"]

    def losses_on(
        self,
        params: Tensors,
        buffers: Tensors,
        pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        batches: ProbeBatches,
    ) -> torch.Tensor:
        """Probe-batch losses of rows ``(shared_from, private_from, data_from)``, each a forward pass by
        the client ``data_from`` whose batch it uses; the pairs are a cohort (:meth:`map_rows`; each
        pair's forward pass is independent of the others): the scoring of received models by PENS,
        FedeRiCo and FedFomo, and AFIND+'s probe losses before and after training (Eq. 15)."""

        def mine(rows: slice) -> Tensors:
            return {
                "loss": self._pair_losses(
                    params, buffers, (pairs[0][rows], pairs[1][rows], pairs[2][rows]), batches
                )
            }

        return self.map_rows(len(pairs[0]), mine)["loss"]

    def map_rows(self, total: int, work: Callable[[slice], Tensors]) -> Tensors:
        """``work(rows)`` on this process's rows of a cohort of ``total`` rows (all of them in one
        process); its tensors (rows in dimension 0) come back in row order and the compute it tallied is
        the whole cohort's, so every process holds every row and charges the clock the same work
        (docs/scale-out.md)."""
        cohort = self.ctx.cohorts.of(total)
        return cohort.map(work, tally=(self.work.forward, self.work.backward))

    def _train(
        self,
        params: Tensors,
        buffers: Tensors,
        owners: Sequence[int],
        t: int,
        epochs: int,
        trainable: set[str],
        step: StepFn | None,
        extra: Tensors | None,
        purpose: str,
    ) -> tuple[Tensors, Tensors, torch.Tensor]:
        """One executor call; parameters outside ``trainable`` ride along with the buffers, frozen."""
        cfg = self.cfg
        train = {k: v for k, v in params.items() if k in trainable}
        frozen = {k: v for k, v in params.items() if k not in trainable}
        bank = ClientBank(tuple(int(o) for o in owners), train, {**buffers, **frozen, **(extra or {})})
        bank.opt_state = self.sgd.init(train, rows=len(owners))
        plan = self.train_data.batch_plan(bank.clients, t, epochs, cfg.batch_size, cfg.drop_last, purpose)
        samples = plan.weight.sum(dim=(1, 2)).double().cpu().numpy()
        self.work.compute(np.asarray(bank.clients), samples, backward=True)
        losses = self.ctx.executor.train(step or self.step, bank, plan, self.train_data, cfg.optimizer.lr)
        new_params = {k: bank.params[k] if k in train else bank.buffers[k] for k in params}
        new_buffers = {k: bank.buffers[k] for k in buffers}
        return new_params, new_buffers, losses

    # ----- peers and mixing ------------------------------------------------------------------------
    def probes(self, t: int) -> ProbeBatches:
        """The round's probe batch of every client (``probe_size`` samples, default ``batch_size``)."""
        return probe_batches(self.train_data, self.ctx.seed, t, self.cfg.probe_size or self.cfg.batch_size)

    def random_peers(self, t: int, k: int | None = None, allowed: np.ndarray | None = None) -> np.ndarray:
        """``k`` (default ``peers``) uniform random neighbours of every client for round ``t``."""
        allowed = self.adjacency if allowed is None else allowed
        return sample_peers(self.ctx.seed, "peers", t, allowed, k or self.cfg.peers)

    def mixed(self, weights: torch.Tensor, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        """New client state: shared tensors ``weights @ rows``; private ones and counters from own rows.

        ``weights`` is ``[n, R]`` over the ``R`` rows of ``params``/``buffers``, whose first ``n`` rows
        must be the clients' own rows (in client order): they supply the private head and counters.
        """
        n = self.num_clients
        shared = self.shared({**params, **buffers})
        if self.models.codec.lossless:
            mixed = mix(shared, weights)
        else:
            own = torch.zeros_like(weights, dtype=torch.bool)
            own[:, :n] = torch.eye(n, dtype=torch.bool, device=weights.device)
            from_self = mix(shared, weights * own)
            from_peers = mix(self.peer_rows(shared), weights * ~own)
            mixed = {k: from_self[k] + from_peers[k] for k in from_self}
        new_p = {k: mixed[k] if k in mixed else v[:n] for k, v in params.items()}
        new_b = {k: mixed[k] if k in mixed else v[:n] for k, v in buffers.items()}
        return new_p, new_b

    def peer_rows(self, shared: Tensors) -> Tensors:
        """Stacked shared rows as the peers that receive them decode them through :attr:`models` (the
        transfers are recorded by :meth:`send_models`)."""
        return self.models.decode(self.round, "peer_model", shared)

    def exchange(
        self,
        t: int,
        pairs: np.ndarray | torch.Tensor,
        kind: str,
        message: Tensors,
        link: Link | None = None,
        to_requester: bool = True,
    ) -> int:
        """Send ``message`` over ``link`` (default: the proxy and loss link) for every ``pairs[i, j]``:
        j → i when ``to_requester``, else i → j; the clock charges each sender the bits the link records.
        Returns the number of transfers."""
        i, j = np.nonzero(np.asarray(torch.as_tensor(pairs).cpu()))
        if len(i):
            src, dst = (j, i) if to_requester else (i, j)
            (link or self.messages).send(t, nodes.clients(src), nodes.clients(dst), kind, message)
        return len(i)

    def request_models(self, t: int, pairs: np.ndarray | torch.Tensor) -> int:
        """Requester i sends its shared model to j for every ``pairs[i, j]`` (``model_request``)."""
        return self.exchange(t, pairs, "model_request", self.dense_message(), self.requests, False)

    def send_models(self, t: int, pairs: np.ndarray | torch.Tensor) -> int:
        """j sends its trained model to i over :attr:`models` for every ``pairs[i, j]`` (``peer_model``)."""
        return self.exchange(t, pairs, "peer_model", self.model_message(), self.models)

    # ----- evaluation and state --------------------------------------------------------------------
    def evaluate(self) -> Evaluation:
        return self.evaluate_bank(self.bank)

    def evaluate_bank(
        self, bank: ClientBank, step: StepFn | None = None, extra: Tensors | None = None
    ) -> Evaluation:
        """Fine-tune a copy of every client's model ``ft_epochs`` epochs, then test it on its own test set.

        The clients are a cohort: each process fine-tunes and tests its block of them (docs/scale-out.md).
        """
        cfg, cohort = self.cfg, self.ctx.cohorts.clients(len(bank))
        bank = ClientBank(
            tuple(cohort.take(bank.clients)), cohort.take_rows(bank.params), cohort.take_rows(bank.buffers)
        )
        extra = None if extra is None else cohort.take_rows(extra)
        if cfg.ft_epochs:
            self.model.train()
            copies = ClientBank(bank.clients, dict(bank.params), {**bank.buffers, **(extra or {})})
            bank = fine_tuned(
                self.ctx.executor,
                step or self.step,
                copies,
                self.sgd.init(bank.params, rows=len(bank.clients)),
                self.train_data,
                self.round,
                cfg.ft_epochs,
                cfg.batch_size,
                cfg.optimizer.lr,
                cfg.drop_last,
            )
            own_buffers = {k: v for k, v in bank.buffers.items() if k not in (extra or {})}
            bank.adopt(bank.params, own_buffers, owned=False)
        return evaluate_clients_on(cohort, self.model, bank, self.ctx.data, self.ctx.config.eval.batch_size)
