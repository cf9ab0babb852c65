"""The aggregation pipeline every family shares: updates in, new state out (:mod:`.pipeline`)."""

from fedge.aggregation import sites
from fedge.aggregation.means import AnchoredMean, BlockMean, WeightedMean
from fedge.aggregation.pipeline import SITES, Pipeline, build_pipeline
from fedge.aggregation.registry import STAGES
from fedge.aggregation.stage import Reducer, Stage, Transform
from fedge.aggregation.updates import Part, Updates

__all__ = [
    "SITES",
    "STAGES",
    "AnchoredMean",
    "BlockMean",
    "Part",
    "Pipeline",
    "Reducer",
    "Stage",
    "Transform",
    "Updates",
    "WeightedMean",
    "build_pipeline",
    "sites",
]
