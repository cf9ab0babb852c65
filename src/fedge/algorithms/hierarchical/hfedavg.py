"""HFedAvg: hierarchical FedAvg, HIST's baseline (Sec. VI-B1).

Every client trains the full model for ``H`` local steps; each edge server averages its clients every
edge round (OMA, or AirComp over all ``d`` coordinates); after ``E`` edge rounds the cloud averages the
``N`` edge models, unweighted (the authors' code averages only the last cell, a bug we do not copy).
"""

from __future__ import annotations

from fedge.algorithms.base import register
from fedge.algorithms.hierarchical.config import HFedAvgConfig
from fedge.algorithms.hierarchical.hierarchy import HierarchicalFL


@register("hfedavg", HFedAvgConfig, "Hierarchical FedAvg: clients -> edge averages -> cloud average")
class HFedAvg(HierarchicalFL[HFedAvgConfig]):
    """Cloud-edge-client FedAvg: every cell trains the whole model, the cloud averages the cells."""

    partitioned = False
