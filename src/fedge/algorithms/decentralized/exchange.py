"""The peer exchange of a decentralized host: choosing peers, sending messages, mixing received models.

Every transfer goes through a peer link (direction "peer"); the clock charges each sender the bits the
link records (the round's traffic, read by :func:`fedge.system.peer_round`). Transfers are metered from
their messages' shapes (:meth:`~fedge.comm.Link.account`): every client's message of a kind has the same
size, and no receiver reads a message's values off the send (mixing decodes the stacked rows through
the model link itself). Mixing is one matrix product over the stacked rows (:mod:`fedge.engine.mixing`);
with a lossy model codec a client mixes its own row exactly and every peer's row as that peer's message
decodes.

Privacy: with ``privacy.peer`` every model a peer sends is its clipped, noised update
(:mod:`fedge.privacy.peer`), made here once per row where the rows are mixed (the sender's own row
included), and recorded on the run's privacy ledger; a run with a peer mechanism (``privacy.peer``, or
AFIND+'s Table 4 ``dp``) also records every other message sent from a peer's data without noise as a
non-private release (:meth:`PeerExchange.unprotected_kinds`), so its epsilon is never overstated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from fedge.aggregation import Part, Updates, sites
from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.algorithms.base import Context
from fedge.algorithms.decentralized.config import DPConfig, PeerConfig, SelectorConfig
from fedge.algorithms.decentralized.hosted import HostedConfig
from fedge.algorithms.decentralized.probes import ProbeBatches, probe_batches
from fedge.comm import Link
from fedge.config import PeerDPConfig
from fedge.data.federated import FederatedData
from fedge.engine import ClientBank
from fedge.errors import ConfigError
from fedge.privacy import GAUSSIAN, Release
from fedge.privacy.peer import peer_releases, released_rows, unprotected
from fedge.rng import numpy_rng
from fedge.runtime.peer_adversary import PeerAdversary
from fedge.runtime.peers import PeerRound
from fedge.tensors import Tensors


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


class PeerExchange:
    """The exchange half of :class:`~fedge.algorithms.decentralized.common.PeerAlgorithm` (a mixin: it
    reads the host's topology, client bank, links and round work, and calls its ``shared``)."""

    cfg: PeerConfig
    ctx: Context
    num_clients: int
    adjacency: np.ndarray
    train_data: FederatedData
    bank: ClientBank
    requests: Link
    messages: Link
    models: Link
    round: int
    this_round: PeerRound
    adversary: PeerAdversary | None
    shared: Callable[[Tensors], Tensors]
    """the tensors of a state that travel (the host's :meth:`PeerAlgorithm.shared`)"""
    probe_data: Callable[[int], FederatedData]
    """the data a round's probes read (the host's :meth:`LocalTraining.probe_data`)"""
    releases_at_mix: bool = True
    """whether the rows :meth:`mixed` gets are the models peers send this round (FedFomo sends the
    models it trained last round, and releases them as it trains)"""

    @property
    def peer_dp(self) -> PeerDPConfig | None:
        """The run's peer-message mechanism (``privacy.peer``), if any."""
        return self.ctx.privacy.config.peer

    def selector_dp(self) -> DPConfig | None:
        """AFIND+'s Table 4 mechanism of this host's neighbour selection, if it selects by AFIND+ with
        ``dp`` set."""
        cfg = self.cfg
        if isinstance(cfg, SelectorConfig):
            return cfg.dp
        if isinstance(cfg, HostedConfig) and cfg.peer_selection == "afind":
            return cfg.afind.dp
        return None

    @property
    def accounted(self) -> bool:
        """Whether the run has a peer mechanism, and so records every message as a privacy release."""
        return self.peer_dp is not None or self.selector_dp() is not None

    def unprotected_kinds(self) -> set[str]:
        """The message kinds this host sends from its data with no noise: models and model requests
        unless ``privacy.peer`` noises them (a request is then the requester's state, built from
        released messages: post-processing), proxies unless Table 4 noises them, losses always."""
        kinds = {"proxy", "loss"}
        if self.peer_dp is None:
            kinds |= {"peer_model", "model_request"}
        dp = self.selector_dp()
        if dp is not None and dp.target == "proxy":
            kinds.discard("proxy")
        return kinds

    def released(
        self, start: Tensors, message: Tensors, senders: torch.Tensor, receivers: torch.Tensor | None = None
    ) -> Tensors:
        """``privacy.peer``'s messages of stacked rows ``message`` trained from ``start``: row r is sent by
        client ``senders[r]`` to every neighbour (``receivers`` None or ``receivers[r] < 0``) or to
        ``receivers[r]`` alone, its noise keyed (round, sender[, receiver]); one release per row."""
        peer = self.peer_dp
        if peer is None:
            raise ValueError("released messages need privacy.peer")
        privacy, t = self.ctx.privacy, self.round
        z = privacy.multiplier(peer.noise_multiplier, "privacy.peer.noise_multiplier")
        who = senders.tolist()
        to = [-1] * len(who) if receivers is None else receivers.tolist()
        keys = [(t, s) if r < 0 else (t, s, r) for s, r in zip(who, to, strict=True)]
        out = released_rows(privacy, {k: start[k] for k in message}, message, keys, peer.clip, z)
        for release in peer_releases(t, who, peer.clip, z):
            privacy.record(release)
        return out

    def probes(self, t: int) -> ProbeBatches:
        """The round's probe batch of every client (``probe_size`` samples, default ``batch_size``), over
        the training data, or under an adversary over the data the probes read (:meth:`probe_data`: an
        honest answer's clean samples, not the stamped copies a backdoor's malicious peers train on)."""
        data = self.train_data if self.adversary is None else self.probe_data(t)
        return probe_batches(data, self.ctx.seed, t, self.cfg.probe_size or self.cfg.batch_size)

    def random_peers(self, t: int, k: int | None = None, allowed: np.ndarray | None = None) -> np.ndarray:
        """``k`` (default ``peers``) uniform random neighbours of every client for round ``t``."""
        allowed = self.adjacency if allowed is None else allowed
        return sample_peers(self.ctx.seed, "peers", t, allowed, k or self.cfg.peers)

    def mixed(
        self,
        weights: torch.Tensor,
        params: Tensors,
        buffers: Tensors,
        sent: Tensors | None = None,
        masks: Tensors | None = None,
        start: tuple[Tensors, Tensors] | None = None,
        pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[Tensors, Tensors]:
        """New client state: shared tensors ``weights @ rows`` (through the peers' aggregation pipeline,
        whose default is that product); private ones and counters from own rows.

        ``weights`` is ``[n, R]`` over the ``R`` rows of ``params``/``buffers``, whose first ``n`` rows
        must be the clients' own rows (in client order): they supply the private head and counters.
        ``sent`` replaces parameters' rows in what peers receive (AFIND+'s noisy updates; a client mixes
        its own row as trained); ``masks`` give each row's kept coordinates of the tensors they name
        (Dis-PFL's sparse models: a coordinate is averaged over the rows that hold it; a malicious
        sender's poisoned row is masked again, so only the values its mask keeps are poisoned).

        With ``privacy.peer`` every row becomes its sender's released message (:meth:`released`), the
        sender's own row included: ``start`` holds the params and buffers each row was trained from
        (default: the bank's, for rows that are the clients' own) and ``pairs`` each row's sender and
        receiver (default: client r to all its neighbours).
        """
        n = self.num_clients
        shared = self.shared({**params, **buffers})
        message = shared if sent is None else self.shared({**params, **sent, **buffers})
        start_p, start_b = start or (self.bank.params, self.bank.buffers)
        senders, receivers = pairs or (torch.arange(n), None)
        if self.peer_dp is not None and self.releases_at_mix:
            shared = message = self.released({**start_p, **start_b}, message, senders, receivers)
        masks = masks or {}
        if self.adversary is not None:  # malicious senders poison what their neighbours receive
            honest = message
            message = self.adversary.sent(self.round, message, {**start_p, **start_b}, senders)
            if masks and message is not honest:  # only the values a sender's mask keeps travel
                message = {k: v * masks[k].to(v) if k in masks else v for k, v in message.items()}
        if self.models.codec.lossless and message is shared:
            parts: tuple[Part, ...] = (Part(shared, weights, masks),)
        else:  # a client's own row exactly, every other row as its message decodes
            own = torch.zeros_like(weights, dtype=torch.bool)
            own[:, :n] = torch.eye(n, dtype=torch.bool, device=weights.device)
            received = self.peer_rows(message)
            parts = (Part(shared, weights * own, masks), Part(received, weights * ~own, masks))
        updates = Updates(sites.PEER, self.round, parts, {k: v[:n] for k, v in shared.items()})
        pipeline = self.ctx.pipeline(sites.PEER)
        if isinstance(pipeline.reducer, FLTrust):
            pipeline.reducer.root = self.own_roots(params, buffers, (start_p, start_b), pipeline.reducer)
        mixed = pipeline.reduce(updates)
        if self.adversary is not None:
            self.adversary.observe(self.round, weights, senders, pipeline, len(parts))
        new_p = {k: mixed[k] if k in mixed else v[:n] for k, v in params.items()}
        new_b = {k: mixed[k] if k in mixed else v[:n] for k, v in buffers.items()}
        return new_p, new_b

    def own_roots(
        self, params: Tensors, buffers: Tensors, start: tuple[Tensors, Tensors], reducer: FLTrust
    ) -> RootUpdate:
        """FLTrust at peers: every peer is its own trusted party (the paper's root update, a model the
        aggregator trained itself and so trusts), its root update its own update of the round, its own
        trained row (the first ``n`` of ``params``, as trained: no codec, poison or peer noise) less the
        model it trained from (``start``'s first ``n``), against which it scores what it receives. No
        root set, so no training beyond the peer's own, already charged. Refused where the rows mixed
        are not this round's updates (FedFomo mixes last round's models)."""
        if not self.releases_at_mix:
            older = f"fltrust at peers needs this round's updates; {self.cfg.name} mixes older models"
            raise ConfigError(f"{reducer.run.key}.at", older)
        n = self.num_clients
        trained, before = self.shared({**params, **buffers}), self.shared({**start[0], **start[1]})
        own = {k: v[:n] for k, v in trained.items()}
        return RootUpdate(own, 0.0, per_output=True, start={k: before[k][:n] for k in own})

    def scored(
        self,
        params: Tensors,
        buffers: Tensors,
        start: tuple[Tensors, Tensors] | None = None,
        senders: torch.Tensor | None = None,
    ) -> tuple[Tensors, Tensors]:
        """The trained rows as a selector scores them (PENS's, FedeRiCo's and AFIND+'s losses): as trained,
        or, where malicious peers poison their probes (``adversary.probes: poisoned``), with their rows
        poisoned as :meth:`mixed` sends them (``start``, ``senders``: as there)."""
        if self.adversary is None or not self.adversary.poisons_probes(self.round):
            return params, buffers
        start_p, start_b = start or (self.bank.params, self.bank.buffers)
        who = torch.arange(self.num_clients) if senders is None else senders
        sent = self.adversary.sent(self.round, {**params, **buffers}, {**start_p, **start_b}, who)
        return {k: sent[k] for k in params}, {k: sent[k] for k in buffers}

    def peer_rows(self, shared: Tensors) -> Tensors:
        """Stacked shared rows as the peers that receive them decode them through :attr:`models` (the
        transfers are recorded by :meth:`send_models`)."""
        return self.this_round.received(self.models, "peer_model", shared)

    def exchange(
        self,
        pairs: np.ndarray | torch.Tensor,
        kind: str,
        shapes: Mapping[str, Sequence[int]],
        link: Link | None = None,
        to_requester: bool = True,
        nonzeros: Mapping[str, int] | None = None,
    ) -> int:
        """Meter a message of tensors shaped ``shapes`` over ``link`` (default: the proxy and loss link)
        for every ``pairs[i, j]``: j → i when ``to_requester``, else i → j; the clock charges each sender
        the bits the link records (``nonzeros``: see :meth:`~fedge.comm.Link.account`). Returns the
        number of transfers. A run with a peer mechanism records the messages as
        :meth:`account_messages` says."""
        count = self.this_round.account(link or self.messages, pairs, kind, shapes, to_requester, nonzeros)
        if count and self.accounted:
            self.account_messages(pairs, kind, to_requester)
        return count

    def account_messages(self, pairs: np.ndarray | torch.Tensor, kind: str, to_requester: bool) -> None:
        """Record the ``kind`` messages of ``pairs`` (senders as :meth:`exchange` reads them): AFIND+'s
        Table 4 proxies as sample-level Gaussian releases of multiplier ``sigma`` (each probe's proxy
        is a sum of per-example gradients clipped to ``clip``, noised with std ``sigma clip``: one example
        moves it by at most ``clip``; one release per probing requester, each with its own noise), the
        :meth:`unprotected_kinds` as non-private releases; models under ``privacy.peer`` are recorded
        where they are released (:meth:`released`)."""
        i, j = np.nonzero(np.asarray(torch.as_tensor(pairs).cpu()))
        senders = (j if to_requester else i).tolist()
        privacy, t, dp = self.ctx.privacy, self.round, self.selector_dp()
        if kind == "proxy" and dp is not None and dp.target == "proxy":
            for sender in sorted(set(senders)):
                count, whose = senders.count(sender), (sender,)
                privacy.record(
                    Release(
                        t, "afind_proxy", "sample", GAUSSIAN, dp.sigma, dp.clip, count=count, clients=whose
                    )
                )
        elif kind in self.unprotected_kinds():
            for release in unprotected(t, kind, senders):
                privacy.record(release)

    def model_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of one client's shared model (every client's are alike), in message order."""
        state = self.shared({**self.bank.params, **self.bank.buffers})
        return {name: tuple(t.shape[1:]) for name, t in state.items()}

    def model_nonzeros(self) -> dict[str, int] | None:
        """How many values of each tensor of a trained model :attr:`models` sends, for a codec that counts
        them (None: all of them, a dense model's; sparse hosts say less)."""
        return None

    def request_models(self, pairs: np.ndarray | torch.Tensor) -> int:
        """Requester i sends its shared model to j for every ``pairs[i, j]`` (``model_request``, dense)."""
        return self.exchange(pairs, "model_request", self.model_shapes(), self.requests, False)

    def send_models(self, pairs: np.ndarray | torch.Tensor) -> int:
        """j sends its trained model to i over :attr:`models` for every ``pairs[i, j]`` (``peer_model``)."""
        shapes, nonzeros = self.model_shapes(), self.model_nonzeros()
        return self.exchange(pairs, "peer_model", shapes, self.models, True, nonzeros)
