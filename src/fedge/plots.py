"""Plots of runs: accuracy against rounds, communicated MB and simulated time (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedge.results import PLOTS, atomic_write  # noqa: E402

AXES = {
    "accuracy_vs_round": ("round", "global round"),
    "accuracy_vs_mb": ("mb_total", "communicated MB (2^20 bytes, all links)"),
    "accuracy_vs_time": ("sim_seconds", "simulated time (s, wireless system model)"),
}
# Comparisons also plot against GiB (2^30 bytes), the unit of the split papers' cost tables.
GIB_AXIS = {"accuracy_vs_gib": ("mb_total", "communicated GiB (2^30 bytes, all links)")}
SCALE = {"accuracy_vs_gib": 1 / 1024}  # per-axis factor from the row key's unit (MB -> GiB)


def _save(figure, path: Path) -> None:
    atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=110, bbox_inches="tight"))
    plt.close(figure)


def plot_runs(
    runs: Sequence[tuple[str, list[dict[str, Any]]]], out_dir: Path, axes: dict[str, tuple[str, str]] = AXES
) -> list[Path]:
    """One PNG per x-axis of ``axes`` in ``out_dir``, with one curve per ``(label, metric rows)`` run."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (key, label) in axes.items():
        figure, axis = plt.subplots(figsize=(5.5, 3.8))
        for name, rows in runs:
            x = [r[key] * SCALE.get(stem, 1) for r in rows]
            axis.plot(x, [100 * r["accuracy"] for r in rows], marker=".", label=name)
        axis.set_xlabel(label)
        axis.set_ylabel("test accuracy (%)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        path = out_dir / f"{stem}.png"
        _save(figure, path)
        written.append(path)
    return written


def plot_run(run_dir: Path, rows: list[dict[str, Any]], label: str) -> list[Path]:
    """The plots of one run, in its ``plots/`` folder."""
    return plot_runs([(label, rows)], Path(run_dir) / PLOTS)
