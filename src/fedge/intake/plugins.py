"""Entry-point groups through which a separately installed package adds models, datasets and algorithms.

A package declares, in its ``pyproject.toml``::

    [project.entry-points."fedge.models"]
    tiny_cnn = "mypkg.models:build_tiny_cnn"

and likewise ``fedge.datasets``, ``fedge.algorithms`` and ``fedge.stages`` (see docs/extending.md for
what each object must be). This module only reads the installed packages' metadata: nothing is
imported, so ``fedge list`` stays fast; :func:`fedge.extend.load_entry_points` imports and registers them.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

GROUPS = {
    "models": "fedge.models",
    "datasets": "fedge.datasets",
    "algorithms": "fedge.algorithms",
    "stages": "fedge.stages",
}


def discovered(kind: str) -> list[EntryPoint]:
    """The installed entry points of ``kind`` (``models``, ``datasets``, ``algorithms`` or ``stages``), by
    name."""
    return sorted(entry_points(group=GROUPS[kind]), key=lambda point: point.name)
