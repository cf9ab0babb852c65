"""The model zoo by name: build a model from config values, list the models and their cut points."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

import torch
from pydantic import TypeAdapter, ValidationError
from torch import nn

from fedge.errors import ConfigError
from fedge.models.base import SplitModel
from fedge.models.cnn import build_cifar_cnn, build_cnn2, build_cnn4, build_lenet5
from fedge.models.cse import build_cse_cifar, build_cse_femnist
from fedge.models.encoder import build_bert
from fedge.models.mlp import build_fcnn, build_mlp
from fedge.models.resnet import build_resnet18
from fedge.models.transformer import build_gpt2, build_llama
from fedge.models.user import as_split_model
from fedge.models.vgg import build_vgg

Builder = Callable[..., nn.Module]  # zoo builders return a SplitModel

MODELS: dict[str, Builder] = {
    "mlp": build_mlp,
    "fcnn": build_fcnn,
    "lenet5": build_lenet5,
    "cnn2": build_cnn2,
    "cnn4": build_cnn4,
    "cifar_cnn": build_cifar_cnn,
    "resnet18": build_resnet18,
    "vgg": build_vgg,
    "cse_cifar": build_cse_cifar,
    "cse_femnist": build_cse_femnist,
    "gpt2": build_gpt2,
    "llama": build_llama,
    "bert": build_bert,
}


def _option_types(builder: Builder) -> dict[str, Any]:
    """The builder's keyword-only parameters (its options) and their annotated types."""
    hints = get_type_hints(builder, include_extras=True)
    params = inspect.signature(builder).parameters.values()
    return {p.name: hints[p.name] for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def validate_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Options checked and coerced against the builder's annotations, each error naming its key."""
    types = _option_types(MODELS[name])
    valid = {}
    for key, value in options.items():
        if key not in types:
            known = ", ".join(types) or "none"
            raise ConfigError(f"model.options.{key}", f"unknown option for {name}; known: {known}")
        try:
            valid[key] = TypeAdapter(types[key]).validate_python(value)
        except ValidationError as error:
            raise ConfigError(f"model.options.{key}", f"{error.errors()[0]['msg']} (got {value!r})") from None
    return valid


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: Any) -> SplitModel:
    """Build zoo model ``name`` for per-sample ``input_shape`` and ``num_classes``, initialised from torch's
    global RNG (the caller seeds it)."""
    if name not in MODELS:
        raise ConfigError("model.name", f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return as_split_model(MODELS[name](tuple(input_shape), num_classes, **validate_options(name, options)))


def model_descriptions() -> dict[str, str]:
    """One line per model: the first line of its builder's docstring."""
    return {name: (inspect.getdoc(builder) or name).splitlines()[0] for name, builder in MODELS.items()}


def model_cut_points(name: str, input_shape: tuple[int, ...], num_classes: int) -> list[tuple[int, str]]:
    """Each valid cut of the default-option model, with the name of the last client-side block.

    The model is built on the meta device: no memory, no compute, and the global RNG is not touched.
    """
    with torch.device("meta"):
        model = build_model(name, input_shape, num_classes)
    return [(cut, model.block_names[cut - 1]) for cut in model.cut_points]
