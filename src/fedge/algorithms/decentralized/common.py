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
metered from the message's shapes on every pair that carries it (:meth:`~fedge.comm.Link.account`).
With a lossy ``codec_model`` a client mixes its own row exactly and every peer's row as it decodes it
(each sender's row encoded with its own link-derived randomness); requests, proxies and losses are
counted at their codec's size while the selection scores with exact values (their decoding is not
modelled). Each round advances the simulated clock by its compute and the peer traffic it sent
(:func:`fedge.system.peer_round`); selection components see the host through a
:class:`~fedge.algorithms.decentralized.view.PeerView`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch

from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.evaluation import FineTunedEvaluation
from fedge.algorithms.decentralized.exchange import PeerExchange
from fedge.algorithms.decentralized.probes import gather
from fedge.algorithms.decentralized.topology import build_topology
from fedge.algorithms.decentralized.training import LocalTraining
from fedge.algorithms.decentralized.view import PeerView
from fedge.comm import Link
from fedge.data.federated import FederatedData
from fedge.engine import ClientBank, buffers_of, classification_loss, make_optimizer, make_step, parameters_of
from fedge.engine.private_step import private_step
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.models import split
from fedge.runtime.peer_adversary import PeerAdversary
from fedge.runtime.peers import PeerRuntime
from fedge.system import forward_flops
from fedge.tensors import Tensors, floating


class PeerAlgorithm(LocalTraining, PeerExchange, FineTunedEvaluation, Algorithm[PeerConfig]):
    """Base of the decentralized family: the client bank, shared and private parameters, the peer view.

    Local training (:class:`~fedge.algorithms.decentralized.training.LocalTraining`), the peer exchange
    and mixing (:class:`~fedge.algorithms.decentralized.exchange.PeerExchange`) and the fine-tuned
    evaluation (:class:`~fedge.algorithms.decentralized.evaluation.FineTunedEvaluation`) are its mixins.
    Subclasses implement :meth:`peer_round`; :meth:`run_round` wraps it with the round's work tally and
    the simulated clock.
    """

    state_fields: tuple[str, ...] = ("round", "bank")

    def reads_run_length(self) -> str | None:
        return None  # no round reads config.rounds

    def __init__(self, ctx: Context, cfg: PeerConfig):
        super().__init__(ctx, cfg)
        if cfg.local_update == "alternating" and cfg.head_epochs >= cfg.local_epochs:
            raise ConfigError("algorithm.head_epochs", "must be below local_epochs in alternating mode")
        self.model = ctx.build_model().to(ctx.device)
        n = ctx.data.num_clients
        if cfg.peers >= n and cfg.peers != type(cfg).model_fields["peers"].default:  # the default: all
            others = f"of {n} clients each has {n - 1} others (the default takes them all)"
            raise ConfigError("algorithm.peers", f"{cfg.peers} peers per client, but {others}")
        self.num_clients = n
        self.train_data: FederatedData = ctx.data  # what local training, probes and fine-tunes draw from
        self.adversary = PeerAdversary.of(ctx.config.adversary, ctx.data, ctx.seed, ctx.cohorts.processes)
        self.adjacency = build_topology(cfg.topology, n, ctx.seed)
        self.neighbours = torch.as_tensor(self.adjacency, device=ctx.device)
        self.head = self._head_names()
        self.private = self.head if cfg.personal == "head" else set()
        self.sgd = make_optimizer(cfg.optimizer)
        plain = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        self.step = private_step(plain, ctx.privacy, self.model)
        params, buffers = parameters_of(self.model), buffers_of(self.model)
        self.bank = ClientBank.broadcast(range(n), params, buffers)
        self.requests = ctx.network.link(cfg.codec_request)  # models sent for probing
        self.messages = ctx.network.link(cfg.codec_proxy)  # proxies and losses
        self.models: Link = ctx.network.link(cfg.codec_model)  # how trained models travel
        self.round = 0
        self.flops_per_sample = forward_flops(self.model, ctx.data.input_shape)
        self.peers = PeerRuntime(ctx, n)
        self.this_round = self.peers.open(0)  # work outside a round is tallied here and never charged
        self.peers.meter_storage("model", {**params, **buffers})

    # ----- the round -------------------------------------------------------------------------------
    def run_round(self, t: int) -> RoundReport:
        """Round ``t`` (:meth:`peer_round`), closed on the clock with its compute and peer traffic."""
        self.round = t
        self.this_round = self.peers.open(t)
        if self.adversary is not None:  # label_flip: the malicious peers' labels flipped from start_round
            self.train_data = self.training_view(self.adversary.data(t, self.ctx.data))
        report = self.peer_round(t)
        self.this_round.close(self.flops_per_sample)
        if self.adversary is not None:
            report = RoundReport(report.train_loss, {**report.extra, **self.adversary.figures(t)})
        return report

    def training_view(self, data: FederatedData) -> FederatedData:
        """What local training, probes and fine-tunes draw from ``data`` (all of it by default)."""
        return data

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
            adversary=self.adversary,
        )

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
