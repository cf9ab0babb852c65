"""Malicious members of a hierarchy's cells (HIST, HFedAvg): their poisoned uploads to the edge server,
and how much of each edge aggregate came from them.

The run's :class:`~fedge.runtime.adversary.Adversary` names the malicious clients and the attack; in a
hierarchy a malicious member attacks in every edge round of every global round from ``start_round`` on.
Each cell is a star of its own, so its uploads are poisoned as a star server's rows are
(:func:`~fedge.runtime.adversary.poisoned`), cell by cell: the reference ``r`` is the model the cell's
edge server broadcast in that edge round, and ``alie`` / ``ipm`` read the honest uploads of the same cell
and edge round (Baruch et al. 2019 and Xie et al. 2020 assume an attacker that sees the rows its
aggregator sees). Only the values the cell's submodel really holds are poisoned (HIST's slots of the
cell's neurons, :meth:`~fedge.runtime.hierarchy.Submodels.real`), so a row stays zero outside them, as
the masked step keeps an honest one. ``gaussian`` draws from ``(seed, "adversary-gaussian", round,
edge round, client)``: fresh noise every edge round, the same for HIST's compact and masked forms.

Under torchrun each process poisons its rows of a cell with the cell's counts; an omniscient attack first
all-gathers the cell's honest uploads, ``H x d`` values (``4 H d`` bytes at fp32) per attacked cell and
edge round (:mod:`fedge.runtime.spread_adversary`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedge.aggregation import Pipeline
from fedge.rng import torch_rng
from fedge.runtime.adversary import Adversary, kept_shares


def edge_noise(
    adversary: Adversary, round_: int, edge_round: int, clients: np.ndarray, device: torch.device
) -> list[torch.Generator] | None:
    """One generator per client of ``clients`` for ``gaussian`` (``None`` for every other attack)."""
    if adversary.config.attack != "gaussian":
        return None
    seed = adversary.seed
    return [torch_rng(seed, "adversary-gaussian", round_, edge_round, int(c), device=device) for c in clients]


def cell_shares(weights: torch.Tensor, bad: np.ndarray, pipeline: Pipeline) -> np.ndarray | None:
    """Each edge's ``sum_M w_i k_i / sum_i w_i k_i`` (``weights`` ``[cells, rows]``, ``bad`` ``[rows]``):
    the share of the cell's aggregate that came from its malicious rows, ``k_i`` how much the reducer kept
    row ``i`` (:attr:`~fedge.aggregation.robust.RobustReport.kept`; 1 for the mean). ``None`` where the
    reducer reports neither."""
    w = weights.double().cpu().numpy()
    kept = kept_shares(pipeline, w.shape)
    if kept is None:
        return None
    used = w * kept
    total = used.sum(axis=1)
    return np.divide(used[:, bad].sum(axis=1), total, out=np.zeros_like(total), where=total > 0)


@dataclass
class CellTally:
    """A global round's attacking uploads and the edges' kept shares, over its edge rounds."""

    uploads: int = 0
    shares: list[np.ndarray] = field(default_factory=list)
    reported: bool = True  # every edge aggregation's reducer said how much it kept

    def add(self, attacking: int, shares: np.ndarray | None) -> None:
        """One edge round: ``attacking`` uploads, each cell's kept share (``None``: not reported)."""
        self.uploads += attacking
        if shares is None:
            self.reported = False
        else:
            self.shares.append(shares)

    def figures(self) -> dict[str, Any]:
        """``malicious``: the round's attacking uploads over its edge rounds; ``malicious_kept``: the mean
        over its edge rounds and cells of each edge's kept share (with the mean at both levels, the
        attackers' share of the cloud's average)."""
        out: dict[str, Any] = {"malicious": self.uploads}
        if self.reported and self.shares:
            out["malicious_kept"] = float(np.mean(np.stack(self.shares)))
        return out
