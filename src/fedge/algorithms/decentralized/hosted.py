"""Peer choice for host optimisers (Ditto, Dis-PFL): random peers, or AFIND+ in its place (AFIND+ Fig. 5).

A host trains its clients' own models; :class:`PeerChoice` then decides whom each client mixes with and
the weights: ``peer_selection="random"`` draws ``peers`` uniform neighbours and averages uniformly (the
host as published, run on a graph); ``"afind"`` substitutes AFIND+'s identification, threshold and
Boltzmann weights (the standard neighbour mode: everyone trains once, proxies and pre-training losses
are measured at the requester's model). Host-specific parts stay the host's.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from fedge.algorithms.decentralized.config import SelectorConfig
from fedge.algorithms.decentralized.probes import ProbeBatches
from fedge.algorithms.decentralized.scores import selection_metrics
from fedge.algorithms.decentralized.selector import AfindSelector, Plan
from fedge.algorithms.decentralized.view import PeerView
from fedge.config import StrictModel
from fedge.engine.mixing import uniform_rows
from fedge.tensors import Tensors


class HostedConfig(StrictModel):
    """Fields a host algorithm adds: how it picks peers, and AFIND+'s knobs when it uses AFIND+."""

    peer_selection: Literal["random", "afind"] = "random"
    """random peers, or AFIND+'s selection"""
    afind: SelectorConfig = Field(default_factory=SelectorConfig)
    """AFIND+'s knobs when peer_selection is afind"""


class PeerChoice:
    """Random peers with uniform weights, or an :class:`AfindSelector`, behind one begin/weights/end API.

    ``peers`` is the host's number of random peers (also the count of AFIND+'s ``topk`` and ``random``
    selections).
    """

    def __init__(self, view: PeerView, selection: str, cfg: SelectorConfig, peers: int):
        self.view = view
        self.peers = peers
        self.selector = AfindSelector(view, cfg, peers) if selection == "afind" else None
        self.chosen: torch.Tensor | None = None

    def begin(self, t: int, batches: ProbeBatches) -> Plan | None:
        """Probe and select at the host bank's current models (AFIND+), or draw random peers."""
        if self.selector is not None:
            plan = self.selector.begin(t, batches)
            self.chosen = plan.chosen
            return plan
        self.chosen = torch.as_tensor(self.view.random_peers(t, self.peers), device=self.view.device)
        return None

    def weights(
        self, plan: Plan | None, params: Tensors, buffers: Tensors, batches: ProbeBatches
    ) -> torch.Tensor:
        """``[n, n]`` mixing weights over the trained rows ``params``/``buffers``."""
        if self.selector is None or plan is None:
            return uniform_rows(self.drawn())
        return self.selector.standard_weights(plan, params, buffers, batches)

    def end(self, t: int, plan: Plan | None) -> dict[str, float]:
        """Send the exchange's messages and return the round's selection metrics."""
        if self.selector is not None and plan is not None:
            return self.selector.end(t, plan)
        chosen = self.drawn()
        self.view.reply(chosen)
        return selection_metrics(chosen)

    def drawn(self) -> torch.Tensor:
        """The round's peers, which :meth:`begin` chose."""
        if self.chosen is None:
            raise RuntimeError("no peers chosen yet: begin() chooses the round's")
        return self.chosen

    def state_dict(self) -> dict[str, Any]:
        return self.selector.state_dict() if self.selector is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.selector is not None:
            self.selector.load_state_dict(state)
