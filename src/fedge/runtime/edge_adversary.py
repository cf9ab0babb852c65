"""Malicious edge servers of a hierarchy (HIST, HFedAvg): who they are, how they poison the model they
upload to the cloud, and how much of the cloud's aggregate came from them.

``adversary.edges`` names them, a list or ``max(1, round(fraction N))`` of the ``N`` edges drawn once
from the run seed's own stream ``(seed, "adversary-edges")``; from ``start_round`` on each replaces its
upload to the cloud by the attack of :func:`~fedge.runtime.adversary.poisoned` after the cloud decoded
it and before the cloud's pipeline, with ``d`` the edge's change from ``r``, the cell's model the cloud
sent it that round. ``scaling``'s default ``n / m`` is the edges over the attacking ones; ``gaussian``
draws from ``(seed, "adversary-gaussian-edge", round, edge)``; ``alie``, ``ipm``, ``min_max`` and
``min_sum`` read the honest edges' uploads of the round (HFedAvg only: HIST's edges hold disjoint
neurons, so no honest edge holds a malicious one's slots). Only the values the cell's submodel holds are
poisoned, as for the members (:mod:`fedge.runtime.cell_adversary`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedge.aggregation import Pipeline
from fedge.config import AdversaryConfig
from fedge.errors import ConfigError
from fedge.rng import numpy_rng, torch_rng
from fedge.runtime.adversary import kept_shares


@dataclass(frozen=True)
class EdgeAdversary:
    """The run's malicious edge servers (``malicious``, sorted ids) and their attack from ``config``."""

    config: AdversaryConfig
    malicious: np.ndarray
    seed: int

    @classmethod
    def of(cls, config: AdversaryConfig | None, num_cells: int, seed: int) -> EdgeAdversary | None:
        """The malicious edges of ``config`` among ``num_cells`` (``None`` without ``adversary.edges``);
        an id beyond the cells is refused on ``adversary.edges``. Under torchrun every process holds
        every cell's reduced upload (the edges' all-reduce), so each poisons them alike: no collective."""
        if config is None or config.edges is None:
            return None
        if isinstance(config.edges, list):
            if max(config.edges) >= num_cells:
                raise ConfigError(
                    "adversary.edges", f"edge {max(config.edges)} is not among the {num_cells} cells"
                )
            bad = np.asarray(config.edges, dtype=np.int64)
        else:
            count = max(1, round(config.edges * num_cells))
            bad = numpy_rng(seed, "adversary-edges").choice(num_cells, size=count, replace=False)
        return cls(config, np.sort(bad), seed)

    def mask(self, round_: int, num_cells: int) -> np.ndarray:
        """Which of the ``num_cells`` edges attack in ``round_`` (none before ``start_round``)."""
        return np.isin(np.arange(num_cells), self.malicious) & (round_ >= self.config.start_round)

    def options(self, bad: np.ndarray) -> dict[str, Any]:
        """The attack's options for one edge's row at a time: ``scaling``'s default scale is the edges
        over the attacking ones (``bad``), not the one row's ``1 / 1``."""
        if self.config.attack == "scaling" and "scale" not in self.config.options:
            return {**self.config.options, "scale": len(bad) / int(bad.sum())}
        return self.config.options

    def noise(self, round_: int, edge: int, device: torch.device) -> list[torch.Generator] | None:
        """``gaussian``'s generator for ``edge`` in ``round_`` (``None`` for every other attack)."""
        if self.config.attack != "gaussian":
            return None
        return [torch_rng(self.seed, "adversary-gaussian-edge", round_, edge, device=device)]

    def figures(
        self, round_: int, weights: torch.Tensor, pipeline: Pipeline, shared: int, owned: np.ndarray
    ) -> dict[str, Any]:
        """``malicious_edges``: the edges that attacked; ``malicious_edges_kept``: their share of the
        cloud's new model, over its values: the ``shared`` values the cloud's pipeline reduced count
        ``sum_M w_j k_j / sum_j w_j k_j`` (``k_j`` how much its reducer kept edge ``j``'s row, 1 for the
        mean), and each edge's ``owned`` values (HIST's neurons it alone holds: one row per coordinate,
        which no reducer can drop) count whole for their edge. Left out where the reducer says neither."""
        bad = self.mask(round_, len(weights))
        out: dict[str, Any] = {"malicious_edges": int(bad.sum())}
        by_output = kept_shares(pipeline, (1, len(weights)))
        if by_output is None:
            return out
        used = weights.double().cpu().numpy() * by_output[0]
        total = float(used.sum())
        share = float(used[bad].sum()) / total if total > 0 else 0.0
        values = shared + int(owned.sum())
        out["malicious_edges_kept"] = (shared * share + float(owned[bad].sum())) / values if values else 0.0
        return out
