"""Where a config comes from, read into a nested dict: a YAML file, ``example:NAME`` (a config shipped
with fedge), YAML text, a dict, a :class:`~fedge.config.RunConfig`, or nothing (the quickstart).

Nothing here imports torch, so the command line reads and checks a config before any training code
loads. The caller's objects are read, never changed: overrides apply to a copy.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fedge.config import CUSTOM_DATA, RunConfig, apply_override, load_raw
from fedge.errors import ConfigError

EXAMPLE_PREFIX = "example:"
CUSTOM_MODEL = "custom"  # the model name of a run with a caller's module (fedge.models.CUSTOM)


def examples_dir() -> Path:
    """The example configs shipped with fedge (``fedge run example:NAME``)."""
    return Path(__file__).parent / "examples"


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
    for assignment in overrides or []:
        apply_override(raw, assignment)
    if custom_data:
        raw["data"] = {**(raw.get("data") or {}), "name": CUSTOM_DATA}
    if custom_model:
        raw["model"] = {**(raw.get("model") or {}), "name": CUSTOM_MODEL}
    return raw
