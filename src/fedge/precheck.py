"""A config checked before torch loads, so that ``fedge run`` answers a typo in a fraction of a second.

Every block is validated as a run validates it, except the algorithm block's own keys: the algorithm's
name is checked against fedge's algorithms (the shipped catalog) and the installed plugins' (their entry
points' names, read without importing them). Its keys, and what needs the data or the model, are
checked when the run is built, after the algorithms load.
"""

from __future__ import annotations

from pathlib import Path

from fedge import catalog, plugins
from fedge.config import RunConfig, parse_config
from fedge.locate import raw_config


def known_names() -> dict[str, set[str]]:
    """Algorithm and dataset names a config may use, from the catalog and the installed entry points."""
    return {
        "algorithms": {*catalog.load()["algorithms"], *(p.name for p in plugins.discovered("algorithms"))},
        "datasets": {p.name for p in plugins.discovered("datasets")},
    }


def precheck(config: RunConfig | dict | str | Path | None, overrides: list[str] | None = None) -> None:
    """Raise the :class:`~fedge.errors.ConfigError` a run of ``config`` would, where torch is not needed
    to tell."""
    parse_config(raw_config(config, overrides), known_names())
