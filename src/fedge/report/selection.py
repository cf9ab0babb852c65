"""The report's neighbour-selection section, for runs whose rounds carry AFIND+'s selection trace (AFIND+
and the algorithms that pick peers with its selector): how many neighbours the clients kept each round,
the threshold they used, and the best helpfulness score they had, which a neighbour's score must reach."""

from __future__ import annotations

import html
import math
import statistics
from typing import Any, Protocol

from fedge.runner.plots import style

TRACE = ("selected_mean", "selected_min", "selected_max", "theta_mean", "score_best_mean")


class TracedCell(Protocol):
    """A report cell: its label and its runs' metrics rows (``runs[i].rows``)."""

    label: str
    runs: list[Any]


def mean_trace(cell: TracedCell) -> list[dict[str, float]]:
    """The cell's trace per round, each figure the mean over its seeds (rounds every seed reached)."""
    traced = [[row for row in run.rows if "selected_mean" in row] for run in cell.runs]
    traced = [rows for rows in traced if rows]
    if not traced:
        return []
    length = min(len(rows) for rows in traced)
    return [
        {"round": traced[0][i]["round"]}
        | {key: statistics.fmean(rows[i][key] for rows in traced) for key in TRACE if key in traced[0][i]}
        for i in range(length)
    ]


def selection_figure(traces: list[tuple[str, list[dict[str, float]]]]) -> Any:
    """Two panels against rounds: neighbours kept (mean over clients, band from the fewest to the most),
    and the mean threshold (solid) next to the mean best score (dotted); one legend of cells below."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    figure, (kept, threshold) = plt.subplots(1, 2, figsize=(11.5, 3.6))
    for index, (label, rows) in enumerate(traces):
        look = style(index)
        rounds = [row["round"] for row in rows]
        kept.plot(rounds, [row["selected_mean"] for row in rows], label=label, linewidth=1.4, **look)
        kept.fill_between(
            rounds, [row["selected_min"] for row in rows], [row["selected_max"] for row in rows],
            color=look["color"], alpha=0.15, linewidth=0,
        )  # fmt: skip
        threshold.plot(rounds, [row["theta_mean"] for row in rows], linewidth=1.4, **look)
        if all("score_best_mean" in row for row in rows):
            best = [row["score_best_mean"] for row in rows]
            threshold.plot(rounds, best, color=look["color"], linestyle=":", linewidth=1.4)
    kept.set_ylabel("neighbours kept per client")
    threshold.set_ylabel("score")
    ways = [
        Line2D([], [], color="0.3", label="threshold"),
        Line2D([], [], color="0.3", ls=":", label="best score"),
    ]
    threshold.legend(handles=ways, fontsize=8, frameon=False)
    for axis in (kept, threshold):
        axis.set_xlabel("round")
        axis.grid(alpha=0.3)
    handles, names = kept.get_legend_handles_labels()
    rows = math.ceil(len(names) / 2)
    figure.legend(
        handles, names, loc="lower center", ncol=min(2, len(names)), frameon=False, fontsize=8,
        bbox_to_anchor=(0.5, -0.04 - 0.05 * rows),
    )  # fmt: skip
    figure.tight_layout()
    return figure


def selection_section(cells: list[TracedCell], figure_uri) -> str:
    """The section's HTML (empty when no cell's rounds carry the trace); ``figure_uri`` embeds a figure."""
    traces = [(cell.label, trace) for cell in cells if (trace := mean_trace(cell))]
    if not traces:
        return ""
    image = figure_uri(selection_figure(traces))
    last = [
        [html.escape(label), f"{rows[-1]['selected_mean']:.2f}", f"{rows[-1]['theta_mean']:.3f}",
         f"{rows[-1].get('score_best_mean', float('nan')):.3f}"]
        for label, rows in traces
    ]  # fmt: skip
    body = "".join(f"<tr><td>{r[0]}</td><td>{r[1]}</td><td>{r[2]}</td><td>{r[3]}</td></tr>" for r in last)
    return (
        "<h2>Neighbour selection</h2>"
        "<p>AFIND+'s selection per round, mean over seeds: a client keeps the neighbours whose helpfulness "
        "score (a softmax of proxy similarities, summing to 1 over its neighbours) reaches its threshold "
        "&theta; = &tau;(1 &minus; sigmoid(h)), h the entropy of its last coreset's similarities "
        "(Eqs. 10-13). "
        "The first round keeps the top <code>k0</code>.</p>"
        f"<figure><img alt='neighbour selection' src='{image}'><figcaption>Left: neighbours kept per "
        "client (line: mean over clients; band: fewest to most). Right: the mean threshold and the mean "
        "best score (dotted); only scores at or above the threshold are kept, and since the scores sum "
        "to 1 at most 1/&theta; can be.</figcaption></figure>"
        "<table><thead><tr><th>cell</th><th>neighbours kept, last round</th><th>threshold</th>"
        f"<th>best score</th></tr></thead><tbody>{body}</tbody></table>"
    )
