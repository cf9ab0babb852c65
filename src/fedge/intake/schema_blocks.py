"""fedge's algorithm config blocks rebuilt from the shipped JSON Schema, so a config's algorithm keys are
checked (and ``fedge list --algorithm`` answered) without importing the algorithms, and so torch.

``schema.json`` is written from the live config classes by ``python -m fedge.intake.catalog`` and a test
keeps it equal to them. Each algorithm's block becomes a pydantic model with the same keys (other spellings
included), types, bounds and choices, on the same :class:`~fedge.config.StrictModel` base, so the errors
read as the real classes' do. They check a block and are never used to build one: a default that a
factory makes (a nested block's) is not in the schema. What a schema cannot state (a validator that
relates two keys, or checks a codec's spelling) is left to the real class when the run is built.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Union

from pydantic import AliasChoices, Field, create_model

from fedge.config import StrictModel
from fedge.intake import catalog

SPELLING = "another spelling of "
BOUNDS = {
    "exclusiveMinimum": "gt",
    "minimum": "ge",
    "exclusiveMaximum": "lt",
    "maximum": "le",
    "minItems": "min_length",
    "maxItems": "max_length",
}
SCALARS = {"integer": int, "number": float, "boolean": bool, "string": str, "null": type(None)}


@functools.cache
def algorithm_blocks() -> dict[str, type[StrictModel]]:
    """Every built-in algorithm's config block, by algorithm name."""
    schema = catalog.load_schema()
    defs = schema["$defs"]
    built: dict[str, type[StrictModel]] = {}
    return {
        name.removeprefix("algorithm:"): _model(name, defs, built)
        for name in defs
        if name.startswith("algorithm:")
    }


def _model(name: str, defs: dict[str, Any], built: dict[str, type[StrictModel]]) -> type[StrictModel]:
    """The block ``defs[name]`` as a model (each nested block built once)."""
    if name in built:
        return built[name]
    node = defs[name]
    properties = node.get("properties", {})
    spellings: dict[str, list[str]] = {}
    for key, prop in properties.items():
        other = prop.get("description", "")
        if other.startswith(SPELLING):
            spellings.setdefault(other.removeprefix(SPELLING), []).append(key)
    required = set(node.get("required", []))
    fields: dict[str, Any] = {}
    for key, prop in properties.items():
        if prop.get("description", "").startswith(SPELLING):
            continue
        annotation = _annotation(prop, defs, built)
        settings: dict[str, Any] = {"default": ... if key in required else prop.get("default")}
        if key in spellings:
            settings["validation_alias"] = AliasChoices(key, *spellings[key])
            settings["serialization_alias"] = key
        fields[key] = (annotation, Field(**settings))
    model = create_model(name.replace(":", "_"), __base__=StrictModel, **fields)
    built[name] = model
    return model


def _annotation(node: dict[str, Any], defs: dict[str, Any], built: dict[str, type[StrictModel]]) -> Any:
    """The Python type a schema node admits, with its bounds."""
    if "$ref" in node:
        return _model(node["$ref"].rsplit("/", 1)[-1], defs, built)
    if "anyOf" in node:
        return Union[tuple(_annotation(option, defs, built) for option in node["anyOf"])]  # noqa: UP007
    if "const" in node:
        return Literal[node["const"]]
    if "enum" in node:
        return Literal[tuple(node["enum"])]
    kind = node.get("type")
    if kind == "array":
        if "prefixItems" in node:
            base: Any = tuple[tuple(_annotation(item, defs, built) for item in node["prefixItems"])]
        else:
            base = list[_annotation(node.get("items", {}), defs, built)]
    elif kind == "object":
        base = dict[str, Any]
    else:
        base = SCALARS.get(kind, Any)
    bounds = {BOUNDS[key]: value for key, value in node.items() if key in BOUNDS}
    return Annotated[base, Field(**bounds)] if bounds else base
