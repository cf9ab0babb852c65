"""The report's language-model section: held-out loss and perplexity against rounds and MB, from round 0.

Next-token accuracy (the report's accuracy figure) moves little while a language model learns; its
held-out loss and perplexity show the learning. The runner evaluates after every round but not before the
first, so round 0 (the model before training) is recomputed here: the run's recorded config is built again
(:func:`fedge.runner.loop.build_run`: the same data, the same initial weights, which depend only on the run
seed) and evaluated, with nothing trained or written. A run that cannot be built again (a custom model or
dataset given through the API, a data folder or checkpoint moved away) has no round-0 point, and the page
says so.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from fedge.runner.plots import style

PANELS = (
    ("round", "loss", "global round", "held-out loss (mean token cross-entropy)"),
    ("round", "perplexity", "global round", "held-out perplexity (log scale)"),
    ("mb_total", "perplexity", "communicated MB (2^20 bytes, all links)", "held-out perplexity (log scale)"),
)


class LMRun(Protocol):
    """A report run: its directory and its metrics rows."""

    path: Path
    rows: list[dict[str, Any]]


class LMCell(Protocol):
    """A report cell: its label and its runs."""

    label: str
    runs: list[Any]


def is_language_model(cell: LMCell) -> bool:
    """Whether every run of the cell reports a perplexity (a causal language model's metric)."""
    return all(any("perplexity" in row for row in run.rows) for run in cell.runs)


def initial_point(run_dir: Path) -> dict[str, float] | None:
    """The held-out figures of the run's model before its first round (``round`` 0, nothing sent yet), or
    ``None`` when the run cannot be built again from its recorded config."""
    from fedge.extend import load_config
    from fedge.files import results
    from fedge.runner.loop import build_run

    try:
        evaluation = build_run(load_config(run_dir / results.CONFIG)).algorithm.evaluate()
    except Exception:  # noqa: BLE001 -- whatever stops the run being built again leaves out its point
        return None
    perplexity = evaluation.extra.get("perplexity", math.exp(evaluation.loss))
    return {"round": 0, "mb_total": 0.0, "loss": evaluation.loss, "perplexity": perplexity}


def run_curve(run: LMRun, start: dict[str, float] | None) -> list[dict[str, float]]:
    """A run's evaluated rounds (loss, perplexity, round, MB), after its round-0 point where known."""
    rows = [row for row in run.rows if "perplexity" in row]
    points = [{key: float(row[key]) for key in ("round", "mb_total", "loss", "perplexity")} for row in rows]
    return ([start] if start is not None else []) + points


def mean_curve(curves: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """Mean over seeds of each figure at the points every curve reached; ``*_std`` the sample deviation."""
    length = min(len(curve) for curve in curves)
    out = []
    for i in range(length):
        point = {key: statistics.fmean(curve[i][key] for curve in curves) for key in curves[0][i]}
        for key in ("loss", "perplexity"):
            values = [curve[i][key] for curve in curves]
            point[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(point)
    return out


def lm_figure(curves: list[tuple[str, list[dict[str, float]]]]) -> Any:
    """Three panels: loss and perplexity against rounds, perplexity against MB; a band of +-1 std."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    figure, axes = plt.subplots(1, 3, figsize=(13.5, 3.9))
    for axis, (x_key, y_key, x_label, y_label) in zip(axes, PANELS, strict=True):
        for index, (label, points) in enumerate(curves):
            look = style(index)
            x = [p[x_key] for p in points]
            y = [p[y_key] for p in points]
            every = max(1, len(x) // 12)
            axis.plot(x, y, label=label, markersize=3.5, linewidth=1.4, markevery=every, **look)
            low = [max(v - p[f"{y_key}_std"], 1e-12) for v, p in zip(y, points, strict=True)]
            high = [v + p[f"{y_key}_std"] for v, p in zip(y, points, strict=True)]
            axis.fill_between(x, low, high, color=look["color"], alpha=0.18, linewidth=0)
        if y_key == "perplexity":
            axis.set_yscale("log")
            low, high = axis.get_ylim()
            minor = ticker.FormatStrFormatter("%g") if high / low < 10 else ticker.NullFormatter()
            axis.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
            axis.yaxis.set_minor_formatter(minor)  # labelled minor ticks only within one decade
        if x_key == "round":
            axis.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        axis.set_xlabel(x_label)
        axis.set_ylabel(y_label)
        axis.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=min(4, len(names)), frameon=False, fontsize=9,
                  bbox_to_anchor=(0.5, -0.02 - 0.05 * math.ceil(len(names) / 4)))  # fmt: skip
    figure.tight_layout()
    return figure


def _row(label: str, curves: list[list[dict[str, float]]], started: bool) -> list[str]:
    """A table row: perplexity at round 0 (mean over seeds), at the last round every seed reached, and
    the last round."""
    mean = mean_curve(curves)
    first = f"{mean[0]['perplexity']:.2f}" if started else "–"
    return [html.escape(label), first, f"{mean[-1]['perplexity']:.2f}", f"{mean[-1]['round']:.0f}"]


Table = Callable[[list[str], list[list[str]]], str]  # the report's HTML table of a head and rows


def lm_section(cells: Sequence[LMCell], figure_uri: Callable[[Any], str], table: Table) -> str:
    """The section's HTML (empty unless every cell is a language model's): the figure (``figure_uri``
    embeds it) and a ``table`` of the perplexity before training and at the last round."""
    if not cells or not all(is_language_model(cell) for cell in cells):
        return ""
    starts = {id(run): initial_point(run.path) for cell in cells for run in cell.runs}
    curves, rows, missing = [], [], []
    for cell in cells:
        started = all(starts[id(run)] is not None for run in cell.runs)
        per_run = [run_curve(run, starts[id(run)] if started else None) for run in cell.runs]
        if not started:
            missing.append(cell.label)
        curves.append((cell.label, mean_curve(per_run)))
        rows.append(_row(cell.label, per_run, started))
    note = (
        f" No round-0 point for {html.escape(', '.join(missing))}: its run cannot be built again from its "
        "recorded config (a model or data given through the API, or inputs moved)."
        if missing
        else ""
    )
    return "\n".join(
        [
            "<h2>Held-out loss and perplexity</h2>",
            f"<figure><img alt='loss and perplexity curves' src='{figure_uri(lm_figure(curves))}'>"
            "<figcaption>Mean token cross-entropy on the held-out tails and its exponential, the perplexity, "
            "at round 0 (the model before training, evaluated again from the run's config and seed) and at "
            "every evaluated round; a line is the mean over a cell's seeds, the band ± one standard "
            f"deviation.{note}</figcaption></figure>",
            table(["cell", "perplexity at round 0", "last perplexity", "last round"], rows),
        ]
    )
