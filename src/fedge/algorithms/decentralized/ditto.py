"""Ditto (Li et al. 2021) on a peer-to-peer graph, with random peers or AFIND+ (AFIND+ Fig. 5).

Each client keeps a collaborative model w_i, trained and mixed exactly like the backbone (peers chosen at
random or by AFIND+), and a personal model v_i trained ``personal_epochs`` epochs per round on
``F_i(v) + lam/2 ||v - w_i^t||^2`` (w_i^t: the collaborative model at the start of the round, what Ditto
regularises towards). Evaluation tests v_i (after the common ``ft_epochs`` fine-tune).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, PositiveInt
from torch.func import functional_call

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.hosted import HostedConfig, PeerChoice
from fedge.config import aliased
from fedge.engine import ClientBank, make_step, weighted_mean
from fedge.engine.private_step import private_step
from fedge.metrics import Evaluation, RoundReport
from fedge.tensors import Tensors, rows

ANCHOR = "anchor::"


class DittoConfig(PeerConfig, HostedConfig):
    """Ditto's proximal strength and personal epochs, plus the host fields (peer choice, AFIND+ knobs)."""

    name: Literal["ditto"] = "ditto"
    """the algorithm (`fedge list`)"""
    lam: Annotated[float, Field(ge=0.0)] = aliased(0.75, "proximal_weight", "lam", "lambda")
    """weight of the personal model's pull towards the collaborative one"""
    personal_epochs: PositiveInt = 1
    """epochs of personal-model training per round"""


@register(
    "ditto", DittoConfig, "Ditto on a graph: personal models pulled to collaborative ones (random/AFIND+)"
)
class Ditto(PeerAlgorithm):
    """Collaborative bank (mixed with peers) and personal bank (proximal local training)."""

    takes_loss = False  # its own loss terms are cross-entropy

    cfg: DittoConfig
    state_fields = (*PeerAlgorithm.state_fields, "personal_bank", "choice")

    def __init__(self, ctx: Context, cfg: DittoConfig):
        super().__init__(ctx, cfg)
        self.choice = PeerChoice(self.view(), cfg.peer_selection, cfg.afind, cfg.peers)
        self.personal_bank = ClientBank(
            self.bank.clients,
            {k: v.clone() for k, v in self.bank.params.items()},
            {k: v.clone() for k, v in self.bank.buffers.items()},
        )
        self.prox_step = private_step(make_step(self._prox_loss, self.sgd), ctx.privacy, self.model)
        model = {**self.personal_bank.params, **self.personal_bank.buffers}
        self.peers.meter_storage("personal_model", rows(model, 0))

    def _prox_loss(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ):
        """Weighted cross-entropy plus ``lam/2 ||params - anchor||^2`` (anchors ride in the buffers)."""
        state = {k: v.clone() for k, v in buffers.items() if not k.startswith(ANCHOR)}
        logits = functional_call(self.model, {**params, **state}, (x,))
        ce = weighted_mean(F.cross_entropy(logits, y, reduction="none"), w)
        prox = sum(((params[k] - buffers[ANCHOR + k]) ** 2).sum() for k in params)
        return ce + 0.5 * self.cfg.lam * prox, {
            **state,
            **{k: v for k, v in buffers.items() if k.startswith(ANCHOR)},
        }

    def peer_round(self, t: int) -> RoundReport:
        own = torch.arange(self.num_clients, device=self.ctx.device)
        batches = self.probes(t)
        plan = self.choice.begin(t, batches)
        start_p, start_b = self.rows(own)
        params, buffers, losses = self.local_update(start_p, start_b, own.tolist(), t)
        weights = self.choice.weights(plan, params, buffers, batches)
        self.bank.adopt(*self.mixed(weights, params, buffers), owned=False)
        metrics = self.choice.end(t, plan)
        anchors = {ANCHOR + k: v for k, v in start_p.items()}
        personal = self.personal_bank
        personal_params, personal_buffers, personal_losses = self.local_update(
            personal.params,
            personal.buffers,
            own.tolist(),
            t,
            anchors,
            lambda p, b, o, e: self._train(
                p, b, o, t, self.cfg.personal_epochs, set(p), self.prox_step, e, "personal"
            ),
        )
        personal.adopt(personal_params, personal_buffers, owned=False)
        return RoundReport(
            float(losses.double().mean()),
            {"personal_loss": float(personal_losses.double().mean()), **metrics},
        )

    def evaluate(self) -> Evaluation:
        return self.evaluate_bank(self.personal_bank)
