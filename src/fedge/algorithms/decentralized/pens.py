"""PENS (Onoszko et al. 2021): performance-based neighbour selection (AFIND+ Table 1; our parameters).

Phase 1 (the first ``selection_rounds`` rounds, default 10 % of the run): every client receives the
trained models of ``candidates`` random neighbours, scores each by its loss on its own probe batch, and
averages (uniformly, own model included) the ``keep`` with the lowest loss; it counts how often each
neighbour made that cut. After phase 1 a client's neighbour set is everyone counted more often than
expected by chance (``T_s * keep / |B_i|``), or its ``peers`` most counted if nobody is. Phase 2 averages
``peers`` random members of that set. The AFIND+ paper gives none of n, k, T_s: these are our choices.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.scores import selection_metrics, top_k
from fedge.engine.mixing import uniform_rows
from fedge.metrics import RoundReport


class PensConfig(PeerConfig):
    """PENS's candidates per round (n), models kept (k) and length of the selection phase (T_s)."""

    name: Literal["pens"] = "pens"
    """the algorithm (`fedge list`)"""
    candidates: PositiveInt = 10
    """candidate models received per round (n)"""
    keep: PositiveInt = Field(5, validate_default=True)
    """models kept from the candidates (k)"""
    selection_rounds: PositiveInt | None = None
    """length of the selection phase (T_s; default: 10% of the run)"""

    @field_validator("keep")
    @classmethod
    def _keep_among_candidates(cls, value: int, info: ValidationInfo) -> int:
        if "candidates" in info.data and value > info.data["candidates"]:
            raise ValueError(f"keeps {value} of {info.data['candidates']} candidates: at most candidates")
        return value


@register(
    "pens", PensConfig, "PENS: neighbours whose models have low loss on my data, then sample among them"
)
class Pens(PeerAlgorithm):
    """Two-phase performance-based selection with uniform averaging."""

    cfg: PensConfig
    state_fields = (*PeerAlgorithm.state_fields, "counts", "friends")

    def __init__(self, ctx: Context, cfg: PensConfig):
        super().__init__(ctx, cfg)
        n = self.num_clients
        self.phase_rounds = cfg.selection_rounds or max(1, round(0.1 * ctx.config.rounds))
        self.counts = torch.zeros(n, n, dtype=torch.int64, device=ctx.device)
        self.friends: torch.Tensor | None = None

    def reads_run_length(self) -> str | None:
        if self.cfg.selection_rounds:
            return None
        return "pens's selection phase is 10 % of the run's rounds; set algorithm.selection_rounds to fix it"

    def peer_round(self, t: int) -> RoundReport:
        own = torch.arange(self.num_clients, device=self.ctx.device)
        params, buffers = self.rows(own)
        params, buffers, losses = self.local_update(params, buffers, own.tolist(), t)
        if t <= self.phase_rounds:
            candidates = torch.as_tensor(self.random_peers(t, self.cfg.candidates), device=own.device)
            i, j = candidates.nonzero(as_tuple=True)
            scores = torch.full(candidates.shape, float("inf"), dtype=torch.float64, device=own.device)
            scored = self.scored(params, buffers)  # what a malicious candidate shows the scoring
            scores[i, j] = self.losses_on(*scored, (j, i, i), self.probes(t)).double()
            chosen = top_k(-scores, candidates, self.cfg.keep)
            self.counts += chosen.long()
            self.send_models(candidates)
        else:
            if self.friends is None:
                self.friends = self._friends()
            allowed = self.friends.cpu().numpy()
            chosen = torch.as_tensor(self.random_peers(t, allowed=allowed), device=own.device)
            self.send_models(chosen)
        self.bank.adopt(*self.mixed(uniform_rows(chosen), params, buffers), owned=False)
        return RoundReport(float(losses.double().mean()), selection_metrics(chosen))

    def _friends(self) -> torch.Tensor:
        """Neighbours counted above chance in phase 1; the ``peers`` most counted where none is."""
        degree = self.neighbours.sum(dim=1, keepdim=True).clamp_min(1)
        expected = self.phase_rounds * min(self.cfg.keep, self.cfg.candidates) / degree
        friends = self.neighbours & (self.counts > expected)
        empty = ~friends.any(dim=1, keepdim=True)
        return torch.where(empty, top_k(self.counts.double(), self.neighbours, self.cfg.peers), friends)
