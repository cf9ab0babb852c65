"""Zoo of splittable models (ordered stacks of named blocks) and client-side auxiliary heads."""

from fedge.models.aux import aux_head
from fedge.models.base import SplitModel, count_parameters, output_shape, split
from fedge.models.registry import MODELS, build_model, model_cut_points, model_descriptions

__all__ = [
    "MODELS",
    "SplitModel",
    "aux_head",
    "build_model",
    "count_parameters",
    "model_cut_points",
    "model_descriptions",
    "output_shape",
    "split",
]
