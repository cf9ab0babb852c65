"""A config checked before torch loads, so that ``fedge run`` answers a typo in a fraction of a second.

Every block is validated as a run validates it. The algorithm's name is checked against fedge's
algorithms (the shipped catalog) and the installed plugins' (their entry points' names, read without
importing them); a built-in algorithm's keys, types, bounds and choices against its block rebuilt from
the shipped schema (:mod:`fedge.schema_blocks`). A plugin algorithm's keys, the few rules a schema cannot
state, and what needs the data or the model are checked when the run is built, after the algorithms load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedge import catalog, plugins
from fedge.config import AlgorithmConfig, RunConfig, config_keys, parse_config
from fedge.locate import raw_config
from fedge.schema_blocks import algorithm_blocks


def known_names() -> dict[str, Any]:
    """Algorithm and dataset names a config may use, from the catalog and the installed entry points,
    and the built-in algorithms' blocks (a plugin's own algorithm of the same name wins: not checked)."""
    plugged = {p.name for p in plugins.discovered("algorithms")}
    blocks = {name: block for name, block in algorithm_blocks().items() if name not in plugged}
    return {
        "algorithms": {*catalog.load()["algorithms"], *plugged},
        "datasets": {p.name for p in plugins.discovered("datasets")},
        "blocks": blocks,
    }


def precheck(
    config: RunConfig | dict | str | Path | None,
    overrides: list[str] | None = None,
    names: dict[str, Any] | None = None,
) -> None:
    """Raise the :class:`~fedge.errors.ConfigError` a run of ``config`` would, where torch is not needed
    to tell. ``names``: :func:`known_names`, when many configs are checked."""
    parse_config(raw_config(config, overrides), names or known_names())


def algorithm_keys(name: str, names: dict[str, Any] | None = None) -> list[str] | None:
    """The keys algorithm ``name``'s block accepts (None: no such algorithm); a built-in's from the
    shipped schema, a plugin's from its class (which imports it). ``names``: :func:`known_names`, when
    the caller has it already."""
    blocks = (names or known_names())["blocks"]
    if name in blocks:
        return config_keys(blocks[name])
    from fedge.extend import load_entry_points

    load_entry_points()
    block = AlgorithmConfig.registry.get(name)
    return None if block is None else config_keys(block)
