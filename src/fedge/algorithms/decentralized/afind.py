"""AFIND+ (Wang et al., "Smart Sampling", 2024): helpful neighbours found by proxy-gradient similarity.

Each round every client i (Algorithm 1, completed as docs/decisions.md says): probes its neighbours (the
gradient of the proxy layer at i's own model on each neighbour's probe batch), updates its helpfulness scores
(Eq. 8, or Eq. 9 with ``p_update="partial"``), selects the coreset ``C_i`` of neighbours whose score passes
its adaptive threshold (top-``k0`` in the first round, top-``k_min`` when nobody passes), collects trained
models and smoothed losses from them (Eq. 15) and mixes with Boltzmann weights (Eq. 16), itself included
(``include_self``). The threshold for the next round then follows from the coreset's similarities (Eqs.
10-13).

``neighbor_mode="literal"`` (default) is Algorithm 1, lines 6-9: each selected neighbour j trains a *copy of
i's model* on its own data and sends it back, so a round trains ``n + sum_i |C_i|`` models (all in one
executor call). ``"standard"`` is the usual DFL reading: every client trains its own model once and
sends that; the proxies and pre-training losses are still measured at the requester's model.

Privacy (Table 4, App. C.4): ``dp`` is a Gaussian mechanism in both of its readings, and the run's
privacy ledger records it so. ``target="proxy"``: a holder's proxy for a requester is the sum of its probe
examples' gradients, each clipped to ``clip``, plus ``N(0, sigma^2 clip^2 I)``, over the batch size: one
example moves the sum by at most ``clip``, so each probe is a sample-level release of multiplier ``sigma``
(``afind_proxy``, one per probing requester: each has its own noise). ``target="update"``: the whole update
a holder sends is clipped to ``clip`` and given noise of std ``sigma clip / L`` (``L`` the batch size): a
client-level release of multiplier ``sigma / L`` (``afind_update``), one per message (literal mode: one
per requester served; standard mode: one per sender, every receiver getting the same row). Table 4 leaves
the rest unnoised (the models and requests, or the proxies, and the reported losses), and the ledger
records those as non-private: its epsilon is then unbounded, as the paper's setting really is unless
``privacy.peer`` also noises the models (:mod:`fedge.algorithms.decentralized.exchange`).
"""

from __future__ import annotations

from typing import Literal

import torch

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig, SelectorConfig
from fedge.algorithms.decentralized.probes import ProbeBatches
from fedge.algorithms.decentralized.selector import AfindSelector, Plan
from fedge.metrics import RoundReport
from fedge.privacy import GAUSSIAN, Release
from fedge.tensors import Tensors


class AfindConfig(PeerConfig, SelectorConfig):
    """AFIND+ = the FedAvg-FT backbone plus the selector's knobs, and who trains what (``neighbor_mode``)."""

    name: Literal["afind"] = "afind"
    """the algorithm (`fedge list`)"""
    neighbor_mode: Literal["literal", "standard"] = "literal"
    """literal (a neighbour trains a copy of the requester's model) or standard"""


@register(
    "afind",
    AfindConfig,
    "AFIND+: proxy-gradient neighbour scores, adaptive threshold, Boltzmann (loss) aggregation",
)
class Afind(PeerAlgorithm):
    """AFIND+ and its ablations (``selection``, ``aggregation``) on the configured topology."""

    cfg: AfindConfig
    state_fields = (*PeerAlgorithm.state_fields, "selector")

    def __init__(self, ctx: Context, cfg: AfindConfig):
        super().__init__(ctx, cfg)
        self.selector = AfindSelector(self.view(), cfg, cfg.peers)

    def peer_round(self, t: int) -> RoundReport:
        batches = self.probes(t)
        plan = self.selector.begin(t, batches)
        if self.cfg.neighbor_mode == "literal":
            losses, trainings = self._literal(t, plan, batches)
        else:
            losses, trainings = self._standard(t, plan, batches)
        metrics = self.selector.end(t, plan)
        return RoundReport(float(losses.double().mean()), {**metrics, "trainings": trainings})

    def _literal(self, t: int, plan: Plan, batches: ProbeBatches) -> tuple[torch.Tensor, int]:
        """Own rows plus one row per (requester i, selected j): i's shared model, j's head, j's data."""
        n = self.num_clients
        own = torch.arange(n, device=plan.chosen.device)
        i, j = plan.chosen.nonzero(as_tuple=True)
        requester, holder = torch.cat([own, i]), torch.cat([own, j])
        start_p, start_b = self.compose(requester, holder)
        params, buffers, losses = self.local_update(start_p, start_b, holder.tolist(), t)
        smoothed = torch.full_like(plan.pre, float("nan"))
        if self.cfg.aggregation == "boltzmann":
            rows = torch.arange(len(holder), device=own.device)
            scored = self.scored(params, buffers, (start_p, start_b), holder)
            post = self.losses_on(*scored, (rows, rows, holder), batches).double()
            smoothed[requester, holder] = self.selector.smoothed(plan.pre[requester, holder], post)
        dp = self.cfg.dp  # the holder reports its loss, then sends a noisy update
        if dp is not None and dp.target == "update" and len(i):
            start_sent = {k: v[n:] for k, v in start_p.items()}
            sent = self.selector.noisy_updates(
                start_sent, {k: v[n:] for k, v in params.items()}, t, self.cfg.batch_size
            )
            params = {k: torch.cat([v[:n], sent[k]]) for k, v in params.items()}
            self.record_updates(j.tolist())
        weights = self.selector.weights(plan.chosen, smoothed)
        per_row = torch.zeros(n, len(holder), dtype=weights.dtype, device=weights.device)
        per_row[requester, torch.arange(len(holder), device=weights.device)] = weights[requester, holder]
        receivers = torch.cat([torch.full_like(own, -1), i])  # own rows go to no one but are mixed in
        mixed = self.mixed(per_row, params, buffers, start=(start_p, start_b), pairs=(holder, receivers))
        self.bank.adopt(*mixed, owned=False)
        return losses[:n], len(holder)

    def _standard(self, t: int, plan: Plan, batches: ProbeBatches) -> tuple[torch.Tensor, int]:
        """Every client trains its own model once; i mixes the trained models of ``C_i`` (and its own)."""
        own = torch.arange(self.num_clients, device=plan.chosen.device)
        start_p, start_b = self.rows(own)
        params, buffers, losses = self.local_update(start_p, start_b, own.tolist(), t)
        weights = self.selector.standard_weights(plan, *self.scored(params, buffers), batches)
        self.bank.adopt(*self.mix_received(t, weights, start_p, params, buffers), owned=False)
        return losses, self.num_clients

    def mix_received(
        self, t: int, weights: torch.Tensor, start: Tensors, params: Tensors, buffers: Tensors
    ) -> tuple[Tensors, Tensors]:
        """Mix trained own rows; with ``dp.target="update"`` peers receive noisy updates, selves do not."""
        dp = self.cfg.dp
        if dp is None or dp.target != "update":
            return self.mixed(weights, params, buffers)
        sent = self.selector.noisy_updates(start, params, t, self.cfg.batch_size)
        eye = torch.eye(self.num_clients, dtype=torch.bool, device=weights.device)
        received = ((weights > 0) & ~eye).any(dim=0)  # one noisy row per sender, whoever receives it
        self.record_updates(torch.nonzero(received).flatten().tolist())
        return self.mixed(weights, params, buffers, sent=sent)

    def unprotected_kinds(self) -> set[str]:
        """As the backbone's, but Table 4's noisy updates are recorded as ``afind_update`` releases."""
        kinds = super().unprotected_kinds()
        if self.cfg.dp is not None and self.cfg.dp.target == "update":
            kinds.discard("peer_model")
        return kinds

    def record_updates(self, senders: list[int]) -> None:
        """Table 4's ``update`` reading on the ledger: one client-level Gaussian release of multiplier
        ``sigma / L`` per noisy update each of ``senders`` sent (std ``sigma clip / L``, sensitivity the
        clipped update's bound ``clip``)."""
        dp = self.cfg.dp
        if dp is None:
            raise ValueError("noisy updates need the selector's dp settings")
        z, t = dp.sigma / self.cfg.batch_size, self.round
        for sender in sorted(set(senders)):
            count, whose = senders.count(sender), (sender,)
            self.ctx.privacy.record(
                Release(t, "afind_update", "client", GAUSSIAN, z, dp.clip, count=count, clients=whose)
            )
