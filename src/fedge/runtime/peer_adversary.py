"""Peers that lie (the ``adversary`` block in the decentralized family): what they send, what they answer
a selector's probes with, and how often honest peers took them in.

The malicious peers are drawn as the star family's clients are
(:func:`~fedge.runtime.adversary.malicious_clients`). From ``start_round`` on, every model a malicious
peer sends a neighbour is poisoned by the star family's attacks
(:func:`~fedge.runtime.adversary.poisoned`) on the stacked sent rows, each row's change measured
from the model it was trained from (the sender's own model before its local training; in AFIND+'s literal
mode the requester's model the holder trained a copy of); ``alie`` and ``ipm`` read the honest rows of
the round. ``label_flip`` trains the malicious peers on flipped labels instead. A malicious peer keeps
its own row as trained (it mixes honestly): it is the honest peers' models that the attack aims at.

``adversary.probes`` says what a malicious peer answers a selector with: ``honest`` (default) answers
AFIND+'s proxy probes and PENS's and FedeRiCo's loss scoring as an honest peer would and poisons only
the models mixed after selection (the attacker that selection cannot see); ``poisoned`` poisons those
too: AFIND+'s gradient proxies by the same attack (a proxy as a row whose change from zero is the
proxy, ``alie`` and ``ipm`` over the honest holders' proxies for the same requester; ``label_flip`` on
the flipped labels), and the models PENS, FedeRiCo and AFIND+'s Boltzmann losses score. A backdoor's
malicious peers train on their stamped view either way; their probe batches are drawn over it (and read
it) only under ``poisoned`` (:meth:`PeerAdversary.probed`).

Under torchrun every process poisons the sent rows after the family's all-gather of the trained rows,
and AFIND+'s proxies in its share of the requesters: nothing is gathered for the adversary (0 bytes a
round; :mod:`fedge.runtime.spread_adversary`) but, per evaluation, a backdoor's per-peer success rates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.aggregation import Pipeline
from fedge.config import AdversaryConfig
from fedge.data.federated import FederatedData
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.runtime.adversary import Adversary, kept_shares
from fedge.tensors import Tensors, floating


@dataclass
class PeerAdversary:
    """The run's malicious peers among ``num_clients`` (an :class:`Adversary` over the peers) and the
    figures of the round's last mixing."""

    adversary: Adversary
    num_clients: int
    seen: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls, config: AdversaryConfig | None, data: FederatedData, seed: int, processes: int
    ) -> PeerAdversary | None:
        """The run's malicious peers (``None`` without an ``adversary`` block)."""
        adversary = Adversary.of(config, data, seed, processes, spread=True)
        return None if adversary is None else cls(adversary, data.num_clients)

    @property
    def honest(self) -> np.ndarray:
        """Boolean ``[n]``: the honest peers (whose accuracy a run reports)."""
        return ~np.isin(np.arange(self.num_clients), self.adversary.malicious)

    def data(self, round_: int, data: FederatedData) -> FederatedData:
        """What the peers train on in ``round_`` (flipped labels for the malicious ones under label_flip)."""
        return self.adversary.data(round_, data)

    def success(
        self, model: nn.Module, bank: ClientBank, data: FederatedData, batch_size: int, cohort: Cohort
    ) -> dict[str, float]:
        """A backdoor's ``attack_success`` of the peers' models in ``bank`` (``cohort``'s block of them):
        the mean over the honest peers of each one's rate on ``data``'s whole test set, the rates gathered
        in client order (a poisoner's own model says nothing, as for ``accuracy``); none for other
        attacks."""
        backdoor = self.adversary.backdoor
        if backdoor is None:
            return {}
        rates = []
        for row, client in enumerate(bank.clients):
            if self.honest[client]:
                params = {k: v[row] for k, v in bank.params.items()}
                buffers = {k: v[row] for k, v in bank.buffers.items()}
                rates.append(backdoor.success(model, params, buffers, data, batch_size))
        return {"attack_success": float(np.mean(cohort.gather_array(np.asarray(rates, dtype=np.float64))))}

    def probed(self, round_: int, data: FederatedData) -> FederatedData:
        """The data the peers' probe batches are drawn over and read in ``round_``: a backdoor's stamped
        view where its malicious peers poison their probe answers (``probes: poisoned``: their batches
        then hold stamped copies, as their training batches do), else ``data`` (an honest answer reads
        the clean samples; a flipped label keeps its index, so ``label_flip`` probes as it did)."""
        backdoor = self.adversary.backdoor
        return backdoor.training if backdoor is not None and self.poisons_probes(round_) else data

    def poisons_probes(self, round_: int) -> bool:
        """Whether malicious peers poison their probe answers in ``round_`` (``probes: poisoned``)."""
        return self.adversary.config.probes == "poisoned" and self.adversary.attacking(round_)

    def sent(self, round_: int, message: Tensors, start: Tensors, senders: torch.Tensor) -> Tensors:
        """``message`` (stacked sent rows, row r sent by ``senders[r]``) with the attacking senders' rows
        poisoned, each row's change measured from its row of ``start`` (floating tensors only)."""
        who = senders.cpu().numpy()
        bad = self.adversary.mask(round_, who)
        if not bad.any():
            return message
        names = list(floating(message))
        changes = {k: message[k] - start[k].to(message[k]) for k in names}
        zero = {k: torch.zeros_like(v[0]) for k, v in changes.items()}
        attacked = self.adversary.poison(round_, who, changes, zero)
        rows = torch.as_tensor(bad, device=next(iter(message.values())).device)
        out = dict(message)
        for k in names:
            out[k] = message[k].clone()
            out[k][rows] = start[k].to(message[k])[rows] + attacked[k][rows]
        return out

    def proxies(
        self, round_: int, requesters: torch.Tensor, holders: torch.Tensor, proxies: torch.Tensor
    ) -> torch.Tensor:
        """AFIND+'s proxies ``[P, D]`` of pairs (``requesters[p]`` probing ``holders[p]``) as poisoning
        holders answer them: per requester, its malicious holders' proxies attacked as rows from zero,
        the omniscient attacks reading its honest holders' proxies."""
        bad = torch.as_tensor(self.adversary.mask(round_, holders.cpu().numpy()), device=proxies.device)
        if not bool(bad.any()) or self.adversary.config.attack == "label_flip":
            return proxies
        out = proxies.clone()
        zero = {"proxy": torch.zeros_like(proxies[0])}
        for i in requesters[bad].unique().tolist():
            pairs = requesters == i
            rows = {"proxy": proxies[pairs]}
            who = holders[pairs].cpu().numpy()
            out[pairs] = self.adversary.poison(round_, who, rows, zero)["proxy"]
        return out

    def observe(
        self, round_: int, weights: torch.Tensor, senders: torch.Tensor, pipeline: Pipeline, parts: int
    ) -> None:
        """Keep the figures of one mixing: ``weights`` ``[n, R]`` on rows sent by ``senders`` ``[R]`` (the
        first ``n`` the peers' own), reduced by ``pipeline`` over ``parts`` joined copies of the columns
        (own rows exactly, then the received ones)."""
        n, count = self.num_clients, weights.shape[1]
        w = weights.double().cpu()
        own = torch.zeros(n, count, dtype=torch.bool)
        own[:, :n] = torch.eye(n, dtype=torch.bool)
        bad_sender = torch.as_tensor(self.adversary.mask(round_, senders.cpu().numpy()))[None, :]
        honest = torch.as_tensor(self.honest)[:, None]
        mixed_in = (w > 0) & ~own & honest
        figures: dict[str, float] = {}
        if mixed_in.any():
            figures["malicious_selected"] = float((mixed_in & bad_sender).sum() / mixed_in.sum())
        kept = _kept(pipeline, n, count, parts, own)
        if kept is not None:
            share = w * kept * honest
            total = float(share.sum())
            figures["malicious_kept"] = float((share * bad_sender).sum()) / total if total > 0 else 0.0
        self.seen = figures

    def figures(self, round_: int) -> dict[str, Any]:
        """The round's figures: ``malicious`` (attacking peers) and, where the round mixed, the share of
        honest peers' mixed-in neighbours that are malicious (``malicious_selected``) and of their mixing
        weight after the reducer's ``kept`` (``malicious_kept``)."""
        attacking = len(self.adversary.malicious) if self.adversary.attacking(round_) else 0
        out, self.seen = {"malicious": attacking, **self.seen}, {}
        return out


def _kept(pipeline: Pipeline, n: int, count: int, parts: int, own: torch.Tensor) -> torch.Tensor | None:
    """How much the peer reducer kept of each (receiver, column) ``[n, count]``: over ``parts`` joined
    copies of the columns, own entries from the first (:func:`~fedge.runtime.adversary.kept_shares`);
    ``None`` for a reducer that does not say."""
    shares = kept_shares(pipeline, (n, parts * count))
    if shares is None:
        return None
    joined = torch.as_tensor(shares, dtype=torch.float64)
    return joined if parts == 1 else torch.where(own, joined[:, :count], joined[:, count:])
