"""The robustness grids of docs/robustness.md from finished sweeps: attack x defence, seeds paired.

Each grid is one or more attacked sweeps (cells labelled by defence, times a grid over the attack) and
the same cells without an adversary. From their ``results.csv`` files this writes, per grid, the final
accuracy of every attack (rows) under every defence (columns) as mean ± std over seeds; each defence's
paired difference from a reference defence (the plain mean) in the same row (same seed: the same
malicious clients, data and initialisation on both sides), with its 95 % interval; the share of the
aggregate's weight that came from malicious rows (``malicious_kept``) and, where the attack has one, the
figure the attack targets (a backdoor's ``final_attack_success``, a selector's ``malicious_selected``);
and without an attack, what each defence costs in simulated seconds::

    fedge sweep examples/sweeps/robust-fedavg-clean.yaml output.dir=runs/robust
    fedge sweep examples/sweeps/robust-fedavg.yaml output.dir=runs/robust
    python examples/robust_tables.py --root runs/robust      # writes docs/results/robustness.md
    python examples/robust_tables.py --root docs/results/robustness   # the same from the kept csv files

It keeps each sweep's ``results.csv`` as ``docs/results/robustness/<sweep>.csv``. Grids whose sweeps
have not run are left out. Only finished runs count.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from fedge.experiments.sweep import RESULTS, paired_text

OUT = Path(__file__).parent.parent / "docs" / "results" / "robustness.md"
KEPT = OUT.with_suffix("")  # docs/results/robustness/<sweep>.csv: each sweep's results.csv
NONE = "none"  # the row of the sweep without an adversary


@dataclass(frozen=True)
class Grid:
    """One table: its title, the attacked sweep, the clean one (or None), the result columns that name a
    row (the attack, after the algorithm where a sweep varies it), the defence its paired differences
    are taken from, and the figures shown beside accuracy."""

    title: str
    attacked: tuple[str, ...]
    clean: tuple[str, ...]
    row_keys: tuple[str, ...] = ("adversary.attack",)
    reference: str = "mean"
    figures: tuple[str, ...] = ("malicious_kept",)


GRIDS = (
    Grid(
        "FedAvg: attack x defence at the server",
        ("robust-fedavg", "robust-fedavg-optimized", "robust-fedavg-boosted", "robust-fedavg-fltrust"),
        ("robust-fedavg-clean", "robust-fedavg-fltrust-clean"),
    ),
    Grid(
        "FedAvg: a targeted backdoor (attack success rate)",
        ("robust-fedavg-backdoor",),
        (),
        row_keys=(),
        figures=("final_attack_success", "malicious_kept"),
    ),
    Grid(
        "Decentralized: malicious peers",
        ("robust-peers",),
        ("robust-peers-clean",),
        reference="gossip",
        figures=("malicious_selected", "malicious_kept"),
    ),
    Grid(
        "Hierarchical: malicious members in the cells",
        ("robust-cells",),
        ("robust-cells-clean",),
        row_keys=("algorithm.name", "adversary.attack"),
    ),
    Grid(
        "CSE-FSL: poisoned smashed data, labels and client models", ("robust-split",), ("robust-split-clean",)
    ),
    Grid("FedBuff: a robust buffer", ("robust-buffer",), ("robust-buffer-clean",)),
)


BOOSTED = {"robust-fedavg-boosted": "sign_flip x4"}
"""Sweeps that vary no row key: the row their runs make."""


def row_name(result: dict[str, str], grid: Grid, sweep: str | None) -> str:
    """The table row a result of ``sweep`` belongs to (``None``: the clean sweep): its row keys' values
    with the attack ``none`` for a clean run; a sweep that varies no row key is one row (a backdoor's
    ``backdoor``, :data:`BOOSTED`)."""
    if sweep in BOOSTED:
        return BOOSTED[sweep]
    if not grid.row_keys:
        return "backdoor"
    clean = sweep is None
    values = [NONE if clean and k == "adversary.attack" else result.get(k, NONE) for k in grid.row_keys]
    return " ".join(values)


def defence(result: dict[str, str]) -> str:
    """The labelled cell a result comes from (its label before the grid's values)."""
    return result["label"].split(", ")[0]


def read(root: Path, sweep: str) -> list[dict[str, str]]:
    """The rows of ``sweep``'s ``results.csv`` under ``root`` (a sweeps' output.dir, or a folder of kept
    ``<sweep>.csv`` files such as :data:`KEPT`); none where it does not exist."""
    for path in (root / sweep / RESULTS, root / f"{sweep}.csv"):
        if path.is_file():
            with path.open() as handle:
                return list(csv.DictReader(handle))
    return []


def keep(root: Path, grids: tuple[Grid, ...]) -> None:
    """Copy every grid's sweep results to :data:`KEPT`, so the tables can be rebuilt without the runs."""
    KEPT.mkdir(parents=True, exist_ok=True)
    for sweep in sorted({s for g in grids for s in (*g.attacked, *g.clean)}):
        source = root / sweep / RESULTS
        if source.is_file():
            shutil.copyfile(source, KEPT / f"{sweep}.csv")


def number(value: str | None) -> float | None:
    return float(value) if value not in (None, "", "None") else None


def by_seed(rows: list[dict[str, str]], column: str, row: str, key: str) -> dict[int, float]:
    """``key`` per seed of the runs under defence ``column`` in table row ``row``."""
    out = {}
    for r in rows:
        value = number(r.get(key))
        if r["_column"] == column and r["_row"] == row and value is not None:
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
    rows: list[dict[str, str]], attacks: list[str], columns: list[str], key: str, scale: float
) -> list[str]:
    """A markdown table of ``key`` (times ``scale``): one line per attack, one column per defence."""
    lines = ["| row | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for attack in attacks:
        cells = [
            spread(list(by_seed(rows, c, attack, key).values()), scale, 2 if scale > 1 else 3)
            for c in columns
        ]
        if any(c != "-" for c in cells):
            lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return lines


def paired(rows: list[dict[str, str]], attacks: list[str], columns: list[str], grid: Grid) -> list[str]:
    """Each defence's final accuracy minus the reference defence's, same attack and seed (points)."""
    others = [c for c in columns if c != grid.reference]
    lines = ["| row | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
    for attack in attacks:
        base = by_seed(rows, grid.reference, attack, "final_accuracy")
        cells = []
        for column in others:
            mine = by_seed(rows, column, attack, "final_accuracy")
            seeds = sorted(set(base) & set(mine))
            cells.append(paired_text([100 * (mine[s] - base[s]) for s in seeds]) if seeds else "-")
        lines.append(f"| {attack} | " + " | ".join(cells) + " |")
    return lines


def section(root: Path, grid: Grid) -> list[str]:
    """The markdown of one grid (empty where its attacked sweep has no results)."""
    attacked = [
        {**r, "_row": row_name(r, grid, sweep), "_column": defence(r)}
        for sweep in grid.attacked
        for r in read(root, sweep)
    ]
    if not attacked:
        return []
    clean = [
        {**r, "_row": row_name(r, grid, None), "_column": defence(r)}
        for sweep in grid.clean
        for r in read(root, sweep)
    ]
    rows = clean + attacked
    columns = list(dict.fromkeys(r["_column"] for r in rows))
    clean_rows = list(dict.fromkeys(r["_row"] for r in clean))
    attack_rows = list(dict.fromkeys(r["_row"] for r in attacked))
    commands = [f"fedge sweep examples/sweeps/{s}.yaml" for s in (*grid.clean, *grid.attacked)]
    seeds = sorted({int(r["seed"]) for r in rows})
    out = [f"### {grid.title}", "", *(f"`{c}`" for c in commands), "", f"Seeds {seeds}.", ""]
    out += ["Final accuracy (%), mean ± std over seeds:", ""]
    out += table(rows, clean_rows + attack_rows, columns, "final_accuracy", 100.0)
    if grid.reference in columns:
        out += ["", f"Final accuracy minus `{grid.reference}`'s, paired by seed (points, 95 % interval):", ""]
        out += paired(rows, clean_rows + attack_rows, columns, grid)
    for figure in grid.figures:
        if any(number(r.get(figure)) is not None for r in attacked):
            out += ["", f"`{figure}`, mean ± std over seeds:", ""]
            out += table(attacked, attack_rows, columns, figure, 1.0)
    if clean:
        out += ["", "Simulated seconds without an attack (each defence's compute is on the clock):", ""]
        out += table(rows, clean_rows, columns, "sim_seconds", 1.0)
    return [*out, ""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("runs/robust"), help="the sweeps' output.dir")
    parser.add_argument("--out", type=Path, default=OUT, help="the markdown file to write")
    args = parser.parse_args(argv)
    if args.root.resolve() != KEPT.resolve():
        keep(args.root, GRIDS)
    parts = ["## Experiments (Fashion-MNIST, small scale, seeds paired)", ""]
    for grid in GRIDS:
        parts += section(args.root, grid)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(parts))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
