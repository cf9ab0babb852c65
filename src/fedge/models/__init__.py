"""Zoo of splittable models (ordered stacks of named blocks) and client-side auxiliary heads."""

from fedge.models.aux import aux_head
from fedge.models.base import SplitModel, count_parameters, output_shape, split
from fedge.models.registry import MODELS, build_model, model_cut_points, model_descriptions
from fedge.models.user import CUSTOM, as_split_model, block_cut, user_factory

__all__ = [
    "CUSTOM",
    "MODELS",
    "SplitModel",
    "as_split_model",
    "aux_head",
    "block_cut",
    "build_model",
    "count_parameters",
    "model_cut_points",
    "model_descriptions",
    "output_shape",
    "split",
    "user_factory",
]
