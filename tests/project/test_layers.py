"""The package's layers, checked statically: imports only go downward (docs/architecture.md).

Every ``import`` and ``from ... import`` in ``src/fedge`` is read with :mod:`ast` (imports under
``TYPE_CHECKING`` included: a layer should not even need to name what sits above it) and mapped to the
top-level part of the package it reaches: ``fedge.algorithms.split.config`` is ``algorithms``,
``from fedge import results`` is ``results``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fedge"

# Bottom to top, as in docs/architecture.md; a part may import its own rank and below.
RANKS = {
    "errors": 0,
    "rng": 0,
    "config": 0,
    "tensors": 0,
    "metrics": 0,
    "files": 0,
    "theory": 1,
    "privacy": 1,
    "data": 2,
    "models": 3,
    "system": 4,
    "comm": 5,
    "engine": 6,
    "aggregation": 6,
    "runtime": 6,
    "distributed": 6,
    "algorithms": 7,
    "tracking": 8,
    "extend": 8,
    "intake": 8,
    "runner": 9,
    "attacks": 9,  # the runner runs in-run attacks (eval.attacks); they read runs it built
    "empirical": 10,
    "api": 10,
    "experiments": 10,
    "report": 10,
    "deploy": 10,
    "cli": 11,
    "__main__": 11,
    "__init__": 11,  # the package root re-exports the API
}
THEORY_MAY_IMPORT = {"theory", "config", "rng", "errors"}
RUNNER_AND_ABOVE = {part for part, rank in RANKS.items() if rank >= RANKS["runner"]}


def part_of_file(path: Path) -> str:
    """The top-level part a source file belongs to (``algorithms`` for ``algorithms/split/config.py``)."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def module_name(path: Path) -> str:
    """The dotted module name of a source file (packages end at ``__init__``)."""
    parts = ("fedge", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, package: str) -> list[tuple[int, str]]:
    """``(line, part)`` for every fedge part that ``source``, a module of ``package``, imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] if base == "fedge" else [base]
        else:
            continue
        for target in targets:
            pieces = target.split(".")
            if pieces[0] == "fedge" and len(pieces) > 1:
                found.append((node.lineno, pieces[1]))
    return found


def imported_parts(path: Path) -> list[tuple[int, str]]:
    """``(line, part)`` for every fedge part that the source file ``path`` imports."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_has_a_rank():
    """A new top-level module or package must be placed in the diagram (and in RANKS) on purpose."""
    unranked = sorted({part_of_file(path) for path in sources()} - set(RANKS))
    assert not unranked, f"parts missing from the layer diagram: {unranked}"


def test_theory_is_a_bottom_layer():
    """``fedge.theory`` computes bounds from numbers: it imports nothing above config, rng and errors."""
    found = [
        f"{path.relative_to(PACKAGE)}:{line} imports fedge.{part}"
        for path in sources()
        if part_of_file(path) == "theory"
        for line, part in imported_parts(path)
        if part not in THEORY_MAY_IMPORT
    ]
    assert not found, "\n".join(found)


def test_nothing_below_the_runner_imports_it_or_what_sits_above_it():
    found = [
        f"{path.relative_to(PACKAGE)}:{line} imports fedge.{part}"
        for path in sources()
        if RANKS.get(part_of_file(path), 0) < RANKS["runner"]
        for line, part in imported_parts(path)
        if part in RUNNER_AND_ABOVE
    ]
    assert not found, "\n".join(found)


def test_imports_only_go_down():
    found = [
        f"{path.relative_to(PACKAGE)}:{line} ({part_of_file(path)}) imports fedge.{part} from a higher layer"
        for path in sources()
        for line, part in imported_parts(path)
        if part in RANKS and RANKS[part] > RANKS.get(part_of_file(path), 0)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import fedge.runner.loop", ["runner"]),
        ("from fedge.algorithms.base import Context", ["algorithms"]),
        ("from fedge import results, costs", ["results", "costs"]),
        ("from fedge.theory import sfl\nimport numpy", ["theory"]),
        ("from . import bound", ["theory"]),
        ("from ..engine import step", ["engine"]),
    ],
)
def test_the_scanner_reads_every_import_form(code, expected):
    assert [part for _, part in imports_in(code, "fedge.theory")] == expected
