"""The model zoo by name: build a model from config values, list the models and their cut points."""

from __future__ import annotations

import inspect
import os
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


TRANSFORMERS = ("gpt2", "llama", "bert")  # built layer by layer from sizes (or read from a checkpoint)
MAX_LAYERS = 1024  # layers of a transformer built from its config (the deepest published have ~100-200)
FLOAT_BYTES = 4


def _option_types(builder: Builder) -> dict[str, Any]:
    """The builder's keyword-only parameters (its options) and their annotated types."""
    hints = get_type_hints(builder, include_extras=True)
    params = inspect.signature(builder).parameters.values()
    return {p.name: hints[p.name] for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def validate_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Options checked and coerced against the builder's annotations, each error naming its key; a
    config-built transformer's size is bounded from them before anything is built (:func:`check_size`)."""
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
    if name in TRANSFORMERS:
        check_size(name, valid)
    return valid


def least_weights(name: str, options: dict[str, Any]) -> int:
    """A lower bound on the weights of transformer ``name`` built from ``options`` (defaults filled in):
    its layers' attention and MLP matrices, without embeddings, biases or norms (the sizes of
    :func:`~fedge.models.transformer.hf_config` and :func:`~fedge.models.encoder.bert_config`)."""
    defaults = inspect.signature(MODELS[name]).parameters
    get = lambda key: options.get(key, defaults[key].default)  # noqa: E731
    hidden, heads = get("hidden"), get("heads")
    intermediate = get("intermediate") or 4 * hidden
    if name == "llama" and get("arch") != "gpt2":  # grouped key/value heads, gated MLP
        kv_width = (get("kv_heads") or heads) * (hidden // heads)
        per_layer = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * intermediate
    else:
        per_layer = 4 * hidden * hidden + 2 * hidden * intermediate
    return get("layers") * per_layer


def check_size(name: str, options: dict[str, Any]) -> None:
    """Refuse a config-built transformer from its options alone: more than :data:`MAX_LAYERS` layers
    (each takes about 20 ms to build, even on the meta device: 100,000 layers kept the memory pre-flight
    busy for 39 minutes), or weights that, as float32, exceed all of this machine's memory. A
    ``pretrained`` model's sizes come from its checkpoint, which the pre-flight reads."""
    if options.get("pretrained") is not None:
        return
    layers = options.get("layers", inspect.signature(MODELS[name]).parameters["layers"].default)
    if layers > MAX_LAYERS:
        built = f"a model built from its config has at most {MAX_LAYERS:,} (each takes ~20 ms to build)"
        raise ConfigError("model.options.layers", f"{layers:,} layers: {built}")
    weights = least_weights(name, options)
    memory = physical_memory()
    if memory is not None and weights * FLOAT_BYTES > memory:
        key = next((k for k in ("hidden", "intermediate", "layers") if k in options), "layers")
        need = f"at least {weights:.3g} weights ({weights * FLOAT_BYTES / 2**30:,.0f} GiB as float32)"
        raise ConfigError(
            f"model.options.{key}", f"{need}, more than all {memory / 2**30:,.0f} GiB of memory"
        )


def physical_memory() -> int | None:
    """This machine's memory in bytes (``None`` where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


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
