"""FedFomo (Zhang et al. 2021, "first order model optimization") on a graph, with random peers or AFIND+.

Every client holds out ``val_fraction`` of its training data as a validation split (stream
``("fedfomo-validation", k)``); local training, probes and the evaluation's fine-tune use the rest. Round t:

1. each client i receives the current models of its peers (``peer_model``; ``peers`` random neighbours, or
   AFIND+'s coreset);
2. it scores every received model on its validation split,
   ``u_n = (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||``, keeps ``max(u_n, 0)`` and normalises
   them to sum 1; if every weight is zero it keeps its own model;
3. it moves its model by the weighted differences, ``theta_i + sum_n w_n (theta_n - theta_i)`` (with
   weights summing to one: ``sum_n w_n theta_n``), one ``[n, n]`` mixing product for all clients;
4. it trains locally (one executor call for all clients).

With ``personal: head`` the head never travels: ``theta_n`` is the peer's shared part with i's own head,
and the distance is taken over the shared tensors that move.

With AFIND+ (``peer_selection: afind``), AFIND+ decides *whom* each client hears (identification and
threshold, Eqs. 8-13) and FedFomo's own rule decides *how much*: AFIND+'s Boltzmann weights (Eq. 16) are
not used, so its ``aggregation`` is ``uniform`` and no loss reports travel. FedFomo's weight already is a
loss-based contribution measure (the loss drop per unit of distance on the receiver's validation split,
computed by the receiver itself), so multiplying it by AFIND+'s loss weights would count the same
evidence twice; keeping it unchanged also keeps the host what its paper defines, as for Ditto and Dis-PFL.

With ``privacy.peer`` the model a client sends in round t+1 is the one it trained in round t, so it is
released (clipped and noised, :mod:`fedge.privacy.peer`) as it is trained, relative to the moved model it
trained from, and the client keeps the released model as its own.

Under an ``adversary`` a malicious peer's sent model is poisoned from the moved model it was trained from
(kept as ``trained_from``), and receivers score and measure that poisoned model: it is what was sent.
"""

from __future__ import annotations

import copy
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig, SelectorConfig
from fedge.algorithms.decentralized.hosted import HostedConfig, PeerChoice
from fedge.algorithms.decentralized.probes import CHUNK_FLOATS, ProbeBatches
from fedge.data.federated import FederatedData
from fedge.engine.personal import padded
from fedge.errors import ConfigError
from fedge.metrics import RoundReport
from fedge.rng import numpy_rng
from fedge.tensors import Tensors


class FomoSelectorConfig(SelectorConfig):
    """AFIND+'s knobs as FedFomo uses them: selection only, FedFomo's weights replace Eq. 16's."""

    aggregation: Literal["uniform"] = "uniform"
    """fixed: FedFomo's own weights mix the peers AFIND+ selects"""


class FedFomoConfig(PeerConfig, HostedConfig):
    """The validation share FedFomo scores peers on, plus the host fields (peer choice, AFIND+ knobs)."""

    name: Literal["fedfomo"] = "fedfomo"
    """the algorithm (`fedge list`)"""
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    """share of each client's training data held out to score peer models"""
    afind: FomoSelectorConfig = Field(default_factory=FomoSelectorConfig)
    """AFIND+'s selection knobs, used when peer_selection is afind"""


def fomo_weights(
    own: torch.Tensor, peer: torch.Tensor, distance: torch.Tensor, received: torch.Tensor
) -> torch.Tensor:
    """FedFomo's row-stochastic ``[n, n]`` weights.

    ``own[i] = L_i(theta_i)``, ``peer[i, n] = L_i(theta_n)`` and ``distance[i, n] = ||theta_n - theta_i||``
    where ``received[i, n]``. ``u = max((own - peer) / distance, 0)`` (0 for a model at distance 0: it
    cannot move i), normalised per row; a row with no positive weight keeps i's own model.
    """
    usable = received & (distance > 0)
    gain = torch.where(usable, own[:, None] - peer, torch.zeros_like(peer))
    u = torch.where(usable, gain / torch.where(usable, distance, torch.ones_like(distance)), 0.0)
    u = u.clamp_min(0.0)
    total = u.sum(dim=1, keepdim=True)
    eye = torch.eye(len(own), dtype=u.dtype, device=u.device)
    return torch.where(total > 0, u / total.clamp_min(torch.finfo(u.dtype).tiny), eye)


def validation_split(data: FederatedData, seed: int, fraction: float) -> tuple[FederatedData, ProbeBatches]:
    """A view of ``data`` whose clients train on ``1 - fraction`` of their samples, and the held-out rest
    (at least one sample each way) as one batch per client."""
    train, held = [], []
    for k, ix in enumerate(data.client_train):
        size = len(ix)
        if size < 2:
            raise ConfigError(
                "algorithm.val_fraction", f"client {k} has {size} sample(s): nothing to hold out"
            )
        count = min(size - 1, max(1, round(fraction * size)))
        order = numpy_rng(seed, "fedfomo-validation", k).permutation(size)
        held.append(np.sort(ix[order[:count]]))
        train.append(np.sort(ix[order[count:]]))
    view = copy.copy(data)  # shares the dataset tensors
    view.client_train = train
    return view, ProbeBatches(*padded(held, data.device))


def pair_distances(tensors: Tensors, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``||theta_j - theta_i||`` over all of ``tensors`` (rows = clients) for each pair, in float64,
    chunked so a chunk gathers at most ``CHUNK_FLOATS`` values per tensor pair."""
    per_pair = sum(v[0].numel() for v in tensors.values())
    chunk = max(1, CHUNK_FLOATS // max(per_pair, 1))
    out = []
    for start in range(0, len(i), chunk):
        a, b = i[start : start + chunk], j[start : start + chunk]
        squares = sum(((v[b] - v[a]).double() ** 2).flatten(1).sum(1) for v in tensors.values())
        out.append(torch.as_tensor(squares, dtype=torch.float64, device=i.device).sqrt())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=i.device)


@register(
    "fedfomo", FedFomoConfig, "FedFomo on a graph: peers weighted by validation loss drop (random/AFIND+)"
)
class FedFomo(PeerAlgorithm):
    """Each round: receive peers' models, weigh them on the validation split, move, then train locally."""

    cfg: FedFomoConfig
    state_fields = (*PeerAlgorithm.state_fields, "choice", "trained_from")
    releases_at_mix = False  # it mixes the models released when they were trained

    def __init__(self, ctx: Context, cfg: FedFomoConfig):
        super().__init__(ctx, cfg)
        self.train_data, self.validation = validation_split(ctx.data, ctx.seed, cfg.val_fraction)
        self.fit_clients = self.train_data.client_train
        self.choice = PeerChoice(self.view(), cfg.peer_selection, cfg.afind, cfg.peers)
        # under an adversary: the moved models the bank's rows were trained from (a sent row's change)
        bank = {**self.bank.params, **self.bank.buffers}
        self.trained_from: Tensors = {} if self.adversary is None else {k: v.clone() for k, v in bank.items()}

    def training_view(self, data: FederatedData) -> FederatedData:
        """``data`` (the run's, or its label-flipped copy) without the validation split."""
        view = copy.copy(data)  # shares the dataset tensors
        view.client_train = self.fit_clients
        return view

    def start(self) -> tuple[Tensors, Tensors] | None:
        """The params and buffers the bank's rows were trained from (``None`` without an adversary)."""
        if self.adversary is None:
            return None
        params = {k: self.trained_from[k] for k in self.bank.params}
        return params, {k: self.trained_from[k] for k in self.bank.buffers}

    def weights(self, received: torch.Tensor, start: tuple[Tensors, Tensors] | None = None) -> torch.Tensor:
        """FedFomo's mixing weights of the current models: validation losses and distances of the received
        pairs (i's own loss included), evaluated for all pairs in one batched call (a share per process).
        A malicious peer's model is scored and measured as it is sent (poisoned from ``start``)."""
        n, device = self.num_clients, received.device
        own = torch.arange(n, device=device)
        i, j = received.nonzero(as_tuple=True)
        params, buffers = self.bank.params, self.bank.buffers
        theirs = j
        if start is not None:  # rows n.. are the models as sent: own rows exact, received ones poisoned
            sent_p, sent_b = self.scored_as_sent(start)
            params = {k: torch.cat([v, sent_p[k]]) for k, v in params.items()}
            buffers = {k: torch.cat([v, sent_b[k]]) for k, v in buffers.items()}
            theirs = j + n
        # (shared from, private from, validation data of): own models, then peer n's shared part on i
        pairs = (torch.cat([own, theirs]), torch.cat([own, i]), torch.cat([own, i]))
        losses = self.losses_on(params, buffers, pairs, self.validation).double()
        peer = torch.full((n, n), float("nan"), dtype=torch.float64, device=device)
        distance = torch.zeros((n, n), dtype=torch.float64, device=device)
        peer[i, j] = losses[n:]
        distance[i, j] = pair_distances(self.shared({**params, **buffers}), i, theirs)
        return fomo_weights(losses[:n], peer, distance, received)

    def scored_as_sent(self, start: tuple[Tensors, Tensors]) -> tuple[Tensors, Tensors]:
        """The bank's rows as their senders send them: malicious ones' shared tensors poisoned as
        :meth:`mixed` poisons them (their change measured from ``start``)."""
        if self.adversary is None:
            raise ValueError("poisoned rows need an adversary")
        params, buffers = self.bank.params, self.bank.buffers
        who, message = torch.arange(self.num_clients), self.shared({**params, **buffers})
        sent = self.adversary.sent(self.round, message, {**start[0], **start[1]}, who)
        return {k: sent.get(k, v) for k, v in params.items()}, {k: sent.get(k, v) for k, v in buffers.items()}

    def peer_round(self, t: int) -> RoundReport:
        plan = self.choice.begin(t, self.probes(t))
        received = self.choice.drawn()
        start = self.start()
        weights = self.weights(received, start)
        moved_p, moved_b = self.mixed(weights, self.bank.params, self.bank.buffers, start=start)
        if start is not None:  # what next round's sent rows are trained from
            self.trained_from = {k: v.clone() for k, v in {**moved_p, **moved_b}.items()}
        own = list(range(self.num_clients))
        params, buffers, losses = self.local_update(moved_p, moved_b, own, t)
        if self.peer_dp is not None:  # what it will send next round: its released update of this one
            trained = self.shared({**params, **buffers})
            message = self.released({**moved_p, **moved_b}, trained, torch.arange(len(own)))
            params = {k: message.get(k, v) for k, v in params.items()}
            buffers = {k: message.get(k, v) for k, v in buffers.items()}
        self.bank.adopt(params, buffers, owned=False)
        metrics = self.choice.end(t, plan)
        kept = torch.diagonal(weights) == 1.0
        used = ((weights > 0) & received).sum(dim=1).double()
        return RoundReport(
            float(losses.double().mean()),
            {**metrics, "kept_own": float(kept.double().mean()), "helpful_mean": float(used.mean())},
        )
