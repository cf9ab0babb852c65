"""The robustness grids of docs/robustness.md from finished sweeps: attack x defence, seeds paired.

Each grid is one attacked sweep (cells labelled by defence, times a grid over the attack) and,
optionally, the same cells without an adversary. From their ``results.csv`` files this writes, per grid,
the final accuracy of every attack (rows) under every defence (columns) as mean ± std over seeds; each
defence's paired difference from the plain mean under the same attack (same seed: the same malicious
clients, data and initialisation on both sides), with its 95 % interval; the share of the aggregate's
weight that came from malicious rows (``malicious_kept``) and, where the attack has one, the figure the
attack targets (a backdoor's ``attack_success``, a selector's ``malicious_selected``); and without an
attack, what each defence costs in accuracy and in simulated seconds::

    fedge sweep examples/sweeps/robust-fedavg-clean.yaml output.dir=runs/robust
    fedge sweep examples/sweeps/robust-fedavg.yaml output.dir=runs/robust
    python examples/robust_tables.py --root runs/robust      # writes docs/results/robustness.md

Grids whose sweeps have not run are left out. Only finished runs count.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from fedge.experiments.sweep import RESULTS, paired_text

OUT = Path(__file__).parent.parent / "docs" / "results" / "robustness.md"
NONE = "none"  # the row of the sweep without an adversary


@dataclass(frozen=True)
class Grid:
    """One table: its title, the attacked sweep, the clean one (or None), the key its rows vary, the
    defence its paired differences are taken from, and extra figures to show."""

    title: str
    attacked: str
    clean: str | None
    row_key: str = "adversary.attack"
    reference: str = "mean"
    figures: tuple[str, ...] = ("malicious_kept",)


GRIDS = (
    Grid("FedAvg: attack x defence at the server", "robust-fedavg", "robust-fedavg-clean"),
    Grid(
        "FedAvg: targeted backdoor (attack success rate)",
        "robust-fedavg-backdoor",
        None,
        figures=("attack_success", "malicious_kept"),
    ),
    Grid(
        "Decentralized: malicious peers",
        "robust-peers",
        "robust-peers-clean",
        row_key="algorithm.name",
        reference="none",
        figures=("malicious_selected",),
    ),
    Grid("Hierarchical: a malicious member per cell", "robust-cells", "robust-cells-clean"),
    Grid("CSE-FSL: poisoned smashed data and client models", "robust-split", "robust-split-clean"),
    Grid("FedBuff: a robust buffer", "robust-buffer", "robust-buffer-clean"),
)


def read(root: Path, sweep: str | None) -> list[dict[str, str]]:
    """The rows of ``root/sweep/results.csv`` (none where it does not exist)."""
    path = root / sweep / RESULTS if sweep else None
    if path is None or not path.is_file():
        return []
    with path.open() as handle:
        return list(csv.DictReader(handle))


def number(value: str | None) -> float | None:
    return float(value) if value not in (None, "", "None") else None


def by_seed(rows: list[dict[str, str]], column: str, row: str, key: str, row_key: str) -> dict[int, float]:
    """``key`` per seed of the runs under defence ``column`` and attack ``row``."""
    out = {}
    for r in rows:
        value = number(r.get(key))
        if r["label"] == column and r.get(row_key, NONE) == row and value is not None:
            out[int(r["seed"])] = value
    return out


def spread(values: list[float], scale: float, digits: int) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def table(
    rows: list[dict[str, str]], attacks: list[str], columns: list[str], grid: Grid, key: str, scale: float
) -> list[str]:
    """A markdown table of ``key`` (times ``scale``): one line per attack, one column per defence."""
    lines = ["| attack | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for attack in attacks:
        cells = [
            spread(list(by_seed(rows, c, attack, key, grid.row_key).values()), scale, 2 if scale > 1 else 3)
            for c in columns
        ]
        if any(c != "-" for c in cells):
            lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return lines


def paired(rows: list[dict[str, str]], attacks: list[str], columns: list[str], grid: Grid) -> list[str]:
    """Each defence's final accuracy minus the reference defence's, same attack and seed (points)."""
    others = [c for c in columns if c != grid.reference]
    lines = ["| attack | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
    for attack in attacks:
        base = by_seed(rows, grid.reference, attack, "final_accuracy", grid.row_key)
        cells = []
        for column in others:
            mine = by_seed(rows, column, attack, "final_accuracy", grid.row_key)
            seeds = sorted(set(base) & set(mine))
            cells.append(paired_text([100 * (mine[s] - base[s]) for s in seeds]) if seeds else "-")
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return lines


def section(root: Path, grid: Grid) -> list[str]:
    """The markdown of one grid (empty where its attacked sweep has no results)."""
    attacked = read(root, grid.attacked)
    if not attacked:
        return []
    clean = (
        [{**r, grid.row_key: NONE} for r in read(root, grid.clean)]
        if grid.row_key == "adversary.attack"
        else []
    )
    rows = clean + attacked
    columns = list(dict.fromkeys(r["label"] for r in rows))
    attacks = ([NONE] if clean else []) + list(dict.fromkeys(r[grid.row_key] for r in attacked))
    commands = [f"fedge sweep examples/sweeps/{s}.yaml" for s in (grid.clean, grid.attacked) if s]
    seeds = sorted({int(r["seed"]) for r in rows})
    out = [f"## {grid.title}", "", *(f"`{c}`" for c in commands), "", f"Seeds {seeds}.", ""]
    out += [
        "Final accuracy (%), mean ± std over seeds:",
        "",
        *table(rows, attacks, columns, grid, "final_accuracy", 100.0),
    ]
    out += ["", f"Final accuracy minus `{grid.reference}`'s, paired by seed (points, 95 % interval):", ""]
    out += paired(rows, attacks, columns, grid)
    for figure in grid.figures:
        if any(number(r.get(figure)) is not None for r in attacked):
            out += ["", f"`{figure}` (mean over rounds where someone attacked), mean ± std over seeds:", ""]
            out += table(attacked, attacks[1:] if clean else attacks, columns, grid, figure, 1.0)
    if clean:
        out += [
            "",
            "Simulated seconds of the run without an attack (the defence's compute is on the clock):",
            "",
        ]
        out += table(rows, [NONE], columns, grid, "sim_seconds", 1.0)
    return [*out, ""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("runs/robust"), help="the sweeps' output.dir")
    parser.add_argument("--out", type=Path, default=OUT, help="the markdown file to write")
    args = parser.parse_args(argv)
    parts = ["# Robustness experiments on Fashion-MNIST (small scale, seeds paired)", ""]
    for grid in GRIDS:
        parts += section(args.root, grid)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(parts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
