"""Where a config comes from, read into a nested dict: a YAML file, ``example:NAME`` (a config shipped
with fedge), YAML text, a dict, a :class:`~fedge.config.RunConfig`, or nothing (the quickstart).

Nothing here imports torch, so the command line reads and checks a config before any training code
loads. The caller's objects are read, never changed: overrides apply to a copy.

An override that switches the algorithm (``algorithm.name=cse_fsl`` on an example written for FedAvg)
drops the keys the config set for its own algorithm that the new one lacks, with a :class:`DroppedKeys`
warning (``fedge`` prints it as one ``note:`` line); a key typed on the command line that the algorithm
lacks stays an error. ``fedge run``, ``deploy`` and ``compare`` all read configs by this rule.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import yaml

from fedge.config import CUSTOM_DATA, DEFAULT_ALGORITHM, RunConfig, apply_override, load_raw
from fedge.errors import ConfigError

EXAMPLE_PREFIX = "example:"
CUSTOM_MODEL = "custom"  # the model name of a run with a caller's module (fedge.models.CUSTOM)


def examples_dir() -> Path:
    """The example configs shipped with fedge (``fedge run example:NAME``)."""
    return Path(__file__).parents[1] / "examples"


def config_source(config: str | Path) -> Path:
    """The file of a config argument: a path, or ``example:NAME`` for a shipped example (``NAME`` may
    name a sub-folder's config, ``example:theory/cse-fsl``)."""
    text = str(config)
    if not text.startswith(EXAMPLE_PREFIX):
        return Path(config)
    name = text[len(EXAMPLE_PREFIX) :]
    path = examples_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")
    if not path.is_file():
        known = sorted(
            str(p.relative_to(examples_dir()).with_suffix("")) for p in examples_dir().rglob("*.yaml")
        )
        raise ConfigError(text, f"no such example; known: {', '.join(known)}")
    return path


def yaml_text(config: Any) -> dict | None:
    """The mapping YAML text holds; ``None`` for a path, ``example:NAME`` or nothing. Text with a line
    break is YAML; one line is YAML only if it holds a mapping and names no existing file."""
    if not isinstance(config, str) or "\n" not in config and (":" not in config or _is_file(config)):
        return None
    if config.startswith(EXAMPLE_PREFIX):
        return None
    try:
        raw = yaml.safe_load(config)
    except yaml.YAMLError:
        return None
    return raw if isinstance(raw, dict) else None


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except OSError:  # a name too long for the file system: not a file
        return False


def raw_config(
    config: RunConfig | dict | str | Path | None = None,
    overrides: list[str] | None = None,
    custom_model: bool = False,
    custom_data: bool = False,
) -> dict[str, Any]:
    """The nested dict of a config argument with ``overrides`` applied (a copy of the caller's); with a
    caller's model or data, ``model.name`` / ``data.name`` say ``custom``."""
    if isinstance(config, RunConfig):
        raw = config.model_dump(mode="json")
    elif isinstance(config, dict):
        raw = copy.deepcopy(config)
    elif (text := yaml_text(config)) is not None:
        raw = text
    else:
        raw = load_raw(config_source(config) if config is not None else None)
    original = algorithm_name(raw)
    for assignment in overrides or []:
        apply_override(raw, assignment)
    typed = {_algorithm_key(assignment) for assignment in overrides or []}
    dropped = switch_algorithm(raw, original, typed - {None})
    if dropped:
        keys = ", ".join(f"algorithm.{key}" for key in dropped)
        new = algorithm_name(raw)
        warnings.warn(f"{keys} set for {original}, which {new} lacks: dropped", DroppedKeys, stacklevel=2)
    if custom_data:
        raw["data"] = {**(raw.get("data") or {}), "name": CUSTOM_DATA}
    if custom_model:
        raw["model"] = {**(raw.get("model") or {}), "name": CUSTOM_MODEL}
    return raw


class DroppedKeys(UserWarning):
    """Algorithm keys a config set for its own algorithm, dropped because an override switched to an
    algorithm that lacks them."""


def algorithm_name(raw: dict[str, Any]) -> Any:
    """The algorithm a raw config names (FedAvg when it names none)."""
    block = raw.get("algorithm")
    return block.get("name", DEFAULT_ALGORITHM) if isinstance(block, dict) else DEFAULT_ALGORITHM


def _algorithm_key(assignment: str) -> str | None:
    """The algorithm key an ``algorithm.KEY...=VALUE`` override sets (None for any other override)."""
    parts = assignment.split("=", 1)[0].strip().split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "algorithm" else None


def switch_algorithm(
    raw: dict[str, Any], original: Any, kept: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """Remove from ``raw``'s algorithm block, and return, the keys algorithm ``original`` has and the
    algorithm the block now names lacks (none when the name did not change). ``kept``: keys the user typed,
    left for the check to refuse. An algorithm whose keys are not known without importing a plugin drops
    nothing (the check then names the key, or the unknown algorithm)."""
    block = raw.get("algorithm")
    name = algorithm_name(raw)
    if not isinstance(block, dict) or not isinstance(name, str) or not isinstance(original, str):
        return []
    if name == original:
        return []
    had, has = _keys_known_now(original), _keys_known_now(name)
    if had is None or has is None:
        return []
    dropped = sorted(key for key in block if key in had and key not in has and key not in kept)
    for key in dropped:
        del block[key]
    return dropped


def _keys_known_now(name: str) -> list[str] | None:
    """Algorithm ``name``'s keys, from the shipped schema or an algorithm registered already; None where
    knowing them would import a plugin (reading a config never does)."""
    from fedge.config import AlgorithmConfig, config_keys
    from fedge.intake.schema_blocks import algorithm_blocks

    blocks = algorithm_blocks()
    if name in blocks:
        return config_keys(blocks[name])
    registered = AlgorithmConfig.registry.get(name)
    return None if registered is None else config_keys(registered)
