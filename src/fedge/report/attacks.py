"""The report's leakage section, for runs that `fedge attack` attacked: each attack's headline figures
(mean ± std over a cell's seeds) with its threat model, and the first run's image grid of originals over
their reconstructions, embedded."""

from __future__ import annotations

import base64
import html
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

ATTACKS_FILE = "attacks.json"
SKIPPED = ("seconds", "seed", "samples", "round", "members", "nonmembers", "known", "unknown", "pairs")


class AttackedCell(Protocol):
    """A report cell: its label and its runs (``runs[i].path``)."""

    label: str
    runs: list[Any]


def _attacks(path: Path) -> dict[str, Any]:
    file = Path(path) / ATTACKS_FILE
    return json.loads(file.read_text()) if file.is_file() else {}


def _mean(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.fmean(values):.3g} ± {statistics.stdev(values):.2g}"


def _grid(path: Path, figures: dict[str, Any]) -> str:
    """The attack's image grid as an embedded PNG (empty when it has none)."""
    name = figures.get("images")
    file = Path(path) / str(name)
    if not name or not file.is_file():
        return ""
    data = base64.b64encode(file.read_bytes()).decode()
    return f"<img alt='originals over reconstructions' src='data:image/png;base64,{data}'>"


def attacks_section(cells: Sequence[AttackedCell], table: Callable[..., str]) -> str:
    """The section's HTML (empty when no run was attacked); ``table(head, rows)`` draws a table (and
    escapes its cells)."""
    rows, grids = [], []
    for cell in cells:
        found = [(run.path, _attacks(run.path)) for run in cell.runs]
        found = [(path, held) for path, held in found if held]
        if not found:
            continue
        for name in dict.fromkeys(n for _, held in found for n in held):
            per_seed = [held[name] for _, held in found if name in held]
            keys = [k for k, v in per_seed[0].items() if isinstance(v, float) and k not in SKIPPED]
            shown = ", ".join(f"{k} {_mean([f[k] for f in per_seed if k in f])}" for k in keys)
            seconds = _mean([f["seconds"] for f in per_seed])
            rows.append([cell.label, name, shown, per_seed[0].get("threat_model", ""), seconds])
            grid = _grid(found[0][0], per_seed[0])
            if grid:
                grids.append(
                    f"<figure>{grid}<figcaption>{html.escape(cell.label)}: {name}</figcaption></figure>"
                )
    if not rows:
        return ""
    head = ["cell", "attack", "figures (mean ± std over seeds)", "threat model", "seconds"]
    intro = (
        "<h2>What leaks</h2><p>The attacks of <code>fedge attack</code> on what each run recorded "
        "(<code>output.record</code>) and on its final model; the seconds are this machine's.</p>"
    )
    return intro + table(head, rows, numeric_from=4) + "".join(grids)
