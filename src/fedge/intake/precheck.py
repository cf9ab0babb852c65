"""A config checked before torch loads, so that ``fedge run`` answers a typo in a fraction of a second.

Every block is validated as a run validates it. The algorithm's name is checked against fedge's
algorithms (the shipped catalog) and the installed plugins' (their entry points' names, read without
importing them); a built-in algorithm's keys, types, bounds and choices against its block rebuilt from
the shipped schema (:mod:`fedge.intake.schema_blocks`); a comparison's ``algorithm.*`` overrides against
the keys of the algorithms compared. A plugin algorithm's keys, the few rules a schema cannot
state, and what needs the data or the model are checked when the run is built, after the algorithms load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedge.config import AlgorithmConfig, RunConfig, config_keys, parse_config
from fedge.errors import ConfigError
from fedge.intake import catalog, plugins
from fedge.intake.locate import raw_config
from fedge.intake.schema_blocks import algorithm_blocks


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


ALGORITHM_PREFIX = "algorithm."


def split_algorithm_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``overrides`` parted into the ``algorithm.*`` ones and the rest (a comparison applies the first
    per algorithm, the rest to the shared config)."""
    algorithm = [o for o in overrides if _dotted_key(o).startswith(ALGORITHM_PREFIX)]
    return algorithm, [o for o in overrides if o not in algorithm]


def _dotted_key(assignment: str) -> str:
    """The ``a.b.c`` of a ``a.b.c=value`` override."""
    return assignment.split("=", 1)[0].strip()


def check_algorithm_overrides(
    overrides: list[str], algorithms: list[str], names: dict[str, Any] | None = None
) -> None:
    """Refuse an unknown algorithm of ``algorithms``, an ``algorithm.*`` override none of them accepts
    (a typo), and one that sets the name (``algorithms`` names them)."""
    names = names or known_names()
    keys_of: dict[str, list[str]] = {}
    for name in algorithms:
        keys = algorithm_keys(name, names)
        if keys is None:
            known = ", ".join(sorted(names["algorithms"]))
            raise ConfigError("--algorithms", f"unknown algorithm {name!r}; known: {known}")
        keys_of[name] = keys
    for assignment in overrides:
        dotted = _dotted_key(assignment)
        if not dotted.startswith(ALGORITHM_PREFIX):
            raise ConfigError(dotted, "is not an algorithm key (algorithm.KEY=VALUE)")
        key = dotted.removeprefix(ALGORITHM_PREFIX).split(".")[0]
        if key == "name":
            raise ConfigError(dotted, "the compared algorithms come from --algorithms; drop this override")
        if not any(key in keys for keys in keys_of.values()):
            raise ConfigError(dotted, f"none of the compared algorithms ({', '.join(keys_of)}) has this key")
