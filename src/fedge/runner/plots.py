"""Plots of runs: accuracy against rounds, communicated MB and simulated time (matplotlib, no display).

Curves use the Okabe-Ito palette (distinguishable with the common colour-vision deficiencies) and
markers as a second cue; a curve whose rows carry ``accuracy_std`` (a mean over seeds) gets a band of
plus/minus one standard deviation. Only evaluated rounds (rows with an accuracy) are drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedge.files.results import PLOTS, atomic_write  # noqa: E402
from fedge.runner.records import evaluated  # noqa: E402

AXES = {
    "accuracy_vs_round": ("round", "global round"),
    "accuracy_vs_mb": ("mb_total", "communicated MB (2^20 bytes, all links)"),
    "accuracy_vs_time": ("sim_seconds", "simulated time (s, wireless system model)"),
}
# A figure named accuracy_vs_gib plots MB rows in GiB (2^30 bytes), the unit of the split papers' cost
# tables (examples/split_mnist_experiment.py reproduces one).
SCALE = {"accuracy_vs_gib": 1 / 1024}  # per-axis factor from the row key's unit (MB -> GiB)
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def style(index: int) -> dict[str, Any]:
    """Colour and marker of the ``index``-th curve."""
    return {"color": OKABE_ITO[index % len(OKABE_ITO)], "marker": MARKERS[index % len(MARKERS)]}


def save(figure, path: Path) -> None:
    """Write ``figure`` to ``path`` (format from its suffix: png or pdf) atomically, and close it."""
    fmt = path.suffix.lstrip(".")
    atomic_write(path, lambda handle: figure.savefig(handle, format=fmt, dpi=150, bbox_inches="tight"))
    plt.close(figure)


def draw_curves(axis, runs: Sequence[tuple[str, list[dict[str, Any]]]], key: str, scale: float = 1.0) -> None:
    """Accuracy (%) against ``key`` for every run on ``axis``, with a +-1 std band where known."""
    for index, (name, rows) in enumerate(runs):
        rows = evaluated(rows)
        x = [r[key] * scale for r in rows]
        y = [100 * r["accuracy"] for r in rows]
        look = style(index)
        axis.plot(x, y, label=name, markersize=3.5, linewidth=1.4, markevery=max(1, len(x) // 12), **look)
        if rows and "accuracy_std" in rows[0]:
            low = [v - 100 * r["accuracy_std"] for v, r in zip(y, rows, strict=True)]
            high = [v + 100 * r["accuracy_std"] for v, r in zip(y, rows, strict=True)]
            axis.fill_between(x, low, high, color=look["color"], alpha=0.18, linewidth=0)
    axis.set_ylabel("test accuracy (%)")
    axis.grid(alpha=0.3)
    if runs:
        axis.legend(fontsize=8, frameon=False)


def plot_runs(
    runs: Sequence[tuple[str, list[dict[str, Any]]]],
    out_dir: Path,
    axes: dict[str, tuple[str, str]] = AXES,
    formats: Sequence[str] = ("png",),
) -> list[Path]:
    """One figure per x-axis of ``axes`` in ``out_dir`` (one file per format), a curve per run."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (key, label) in axes.items():
        for fmt in formats:
            figure, axis = plt.subplots(figsize=(5.5, 3.8))
            draw_curves(axis, runs, key, SCALE.get(stem, 1))
            axis.set_xlabel(label)
            path = out_dir / f"{stem}.{fmt}"
            save(figure, path)
            written.append(path)
    return written


def plot_run(run_dir: Path, rows: list[dict[str, Any]], label: str) -> list[Path]:
    """The plots of one run, in its ``plots/`` folder."""
    return plot_runs([(label, rows)], Path(run_dir) / PLOTS)
