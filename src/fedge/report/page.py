"""``fedge report``: one self-contained HTML page of a run, a sweep or a comparison (figures embedded).

Every run directory found under the given path is read; runs whose configs differ only in their seed
form one *cell* (a sweep's cell, a comparison's algorithm), named by the config keys that differ
between cells. The page shows accuracy against rounds, MB and simulated seconds (a cell's mean over
seeds with a band of one standard deviation), the simulated time and energy by phase and node tier, the
time-to-target table, the cost per link (ledger kind and direction) and per node (traffic, peak storage
and simulated energy), the config diff between cells and each cell's runs. Figures are PNG data URIs:
the file opens anywhere, with no network. A language model's runs also get their held-out loss and
perplexity from round 0, the model before training (:mod:`fedge.report.lm`).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedge.experiments.labels import config_diff, labels
from fedge.files import results
from fedge.report.attacks import attacks_section
from fedge.report.lm import lm_section
from fedge.report.rundirs import find_run_dirs
from fedge.report.selection import selection_section
from fedge.runner.records import MIB, evaluated

REPORT = "report.html"
AXES = (
    ("round", "global round"),
    ("mb_total", "communicated MB (2^20 bytes, all links)"),
    ("sim_seconds", "simulated time (s)"),
)


@dataclass
class Run:
    """One finished (or partial) run directory as the report reads it."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def seed(self) -> int:
        return self.config.get("seed", 0)


@dataclass
class Cell:
    """Runs alike but for their seed."""

    label: str
    runs: list[Run] = field(default_factory=list)

    @property
    def finished(self) -> list[Run]:
        return [r for r in self.runs if r.summary is not None]


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Every run that ``paths`` name: run directories, folders of runs, patterns
    (:mod:`fedge.report.rundirs`)."""
    runs = []
    for run_dir in find_run_dirs(paths):
        summary_path = run_dir / results.SUMMARY
        runs.append(
            Run(
                run_dir,
                yaml.safe_load((run_dir / results.CONFIG).read_text()) or {},
                results.read_jsonl(run_dir / results.METRICS),
                json.loads(summary_path.read_text()) if summary_path.is_file() else None,
            )
        )
    return runs


def group_cells(runs: list[Run]) -> list[Cell]:
    """Runs grouped by their config without seed and output, in order of first appearance."""
    keyed: dict[str, Cell] = {}
    for run in runs:
        identity = {k: v for k, v in run.config.items() if k not in ("seed", "output", "tracking")}
        keyed.setdefault(yaml.safe_dump(identity, sort_keys=True), Cell("")).runs.append(run)
    cells = list(keyed.values())
    names = labels([c.runs[0].config for c in cells], [c.runs[0].path.name for c in cells], ignore=("seed",))
    for cell, name in zip(cells, names, strict=True):
        cell.label = sweep_labels(cell.runs[0].path).get(cell.runs[0].path.name, name)
    return cells


def sweep_labels(run_dir: Path) -> dict[str, str]:
    """The cell labels a sweep gave its runs (from its ``index.csv``), by run directory name."""
    index = run_dir.parent.parent / "index.csv"
    if not index.is_file():
        return {}
    with index.open() as handle:
        return {Path(row["run"]).name: row["label"] for row in csv.DictReader(handle)}


def mean_curve(cell: Cell) -> list[dict[str, float]]:
    """A cell's accuracy per evaluated round (rounds all its runs reached): mean and std over seeds."""
    scored = [evaluated(r.rows) for r in cell.runs]
    length = min(len(rows) for rows in scored)
    curve = []
    for i in range(length):
        point = {key: statistics.fmean(rows[i][key] for rows in scored) for key, _ in AXES}
        values = [rows[i]["accuracy"] for rows in scored]
        point["accuracy"] = statistics.fmean(values)
        point["accuracy_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        curve.append(point)
    return curve


def _figure_uri(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=130, bbox_inches="tight")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def accuracy_figure(cells: list[Cell]) -> str:
    """Accuracy against rounds, MB and simulated seconds, one curve per cell (band: +-1 std over seeds)."""
    import matplotlib.pyplot as plt

    from fedge.runner.plots import draw_curves

    curves = [(cell.label, mean_curve(cell)) for cell in cells]
    figure, axes = plt.subplots(1, 3, figsize=(13.5, 3.9), sharey=True)
    for axis, (key, label) in zip(axes, AXES, strict=True):
        draw_curves(axis, curves, key)
        axis.set_xlabel(label)
        if axis is not axes[0]:
            axis.set_ylabel("")
        axis.get_legend().remove()
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(
        handles,
        names,
        loc="lower center",
        ncol=min(4, len(names)),
        frameon=False,
        fontsize=9,
        bbox_to_anchor=(0.5, -0.02 - 0.05 * math.ceil(len(names) / 4)),
    )
    figure.tight_layout()
    return _figure_uri(figure)


def link_costs(run: Run) -> dict[str, float]:
    """MB per link (``kind, direction``) of a finished run, from its summary."""
    return {f"{k['kind']} ({k['direction']})": k["bits"] / MIB for k in run.summary.get("ledger_kinds", [])}


def links_figure(cells: list[Cell], table: dict[str, dict[str, float]]) -> str:
    """Stacked horizontal bars: each cell's mean MB per link."""
    import matplotlib.pyplot as plt

    from fedge.runner.plots import OKABE_ITO

    links = list(dict.fromkeys(link for row in table.values() for link in row))
    figure, axis = plt.subplots(figsize=(9, 0.55 * len(cells) + 1.4))
    left = [0.0] * len(cells)
    for i, link in enumerate(links):
        values = [table[c.label].get(link, 0.0) for c in cells]
        hatch = "//" if i >= len(OKABE_ITO) else None
        axis.barh(
            range(len(cells)), values, left=left, label=link, color=OKABE_ITO[i % len(OKABE_ITO)], hatch=hatch
        )
        left = [a + b for a, b in zip(left, values, strict=True)]
    axis.set_yticks(range(len(cells)), [c.label for c in cells])
    axis.invert_yaxis()
    axis.set_xlabel("communicated MB (2^20 bytes), mean over seeds")
    axis.grid(axis="x", alpha=0.3)
    axis.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1))
    return _figure_uri(figure)


def node_costs(run: Run) -> list[dict[str, Any]]:
    """Per node of a finished run: MB sent and received (from ``ledger.csv``) and peak storage (MB)."""
    sent: dict[str, int] = defaultdict(int)
    received: dict[str, int] = defaultdict(int)
    ledger = run.path / results.LEDGER
    if ledger.is_file():
        with ledger.open() as handle:
            for entry in csv.DictReader(handle):
                bits = int(entry["bits"])
                sent[entry["src"]] += bits
                received[entry["dst"]] += bits
    joules: dict[str, float] = defaultdict(float)
    energy = run.path / results.ENERGY
    if energy.is_file():
        with energy.open() as handle:
            joules.update({entry["node"]: float(entry["joules"]) for entry in csv.DictReader(handle)})
    peak = run.summary.get("peak_storage_bits", {})
    nodes = list(dict.fromkeys([*peak, *sent, *received, *joules]))
    return [
        {
            "node": n,
            "sent": sent[n] / MIB,
            "received": received[n] / MIB,
            "peak": peak.get(n, 0) / MIB,
            "energy": joules[n],
        }
        for n in nodes
    ]


def _aggregate_clients(rows: list[dict[str, Any]], limit: int = 12) -> list[dict[str, Any]]:
    """Nodes as they are when few; otherwise each node type's clients as min / mean / max rows."""
    if len(rows) <= limit:
        return rows
    out = [r for r in rows if not r["node"].startswith("client")]
    clients = [r for r in rows if r["node"].startswith("client")]
    for name, pick in (("min", min), ("mean", statistics.fmean), ("max", max)):
        out.append(
            {"node": f"clients ({name} of {len(clients)})"}
            | {k: pick(r[k] for r in clients) for k in ("sent", "received", "peak", "energy")}
        )
    return out


def default_targets(cells: list[Cell]) -> list[float]:
    """Without given levels: the lowest mean final accuracy over cells (rounded down to 1 %)."""
    finals = [statistics.fmean(r.summary["final_accuracy"] for r in c.finished) for c in cells if c.finished]
    return [math.floor(100 * min(finals)) / 100] if finals else []


def _targets(cells: list[Cell], given: list[float] | None) -> list[float]:
    if given:
        return sorted(set(given))
    levels = set()
    for cell in cells:
        stop = cell.runs[0].config.get("stop") or {}
        levels.update(stop.get("targets") or [])
        if stop.get("target_accuracy") is not None:
            levels.add(stop["target_accuracy"])
    return sorted(levels) or default_targets(cells)


def _pm(values: list[float], digits: int, scale: float = 1.0) -> str:
    if not values:
        return "–"
    mean = scale * statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def _table(head: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if i >= numeric_from else "txt"}">{html.escape(str(v))}</td>'
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _first_hit(rows: list[dict[str, Any]], level: float) -> dict[str, Any] | None:
    return next((r for r in evaluated(rows) if r["accuracy"] >= level), None)


def headline_table(cells: list[Cell]) -> str:
    """One row per cell: accuracy (next-token accuracy and perplexity for a language model), rounds and
    costs, as mean ± std over its finished seeds."""
    finished = [r.summary for c in cells for r in c.finished]
    perplexity = bool(finished) and all("final_perplexity" in s for s in finished)
    head = [
        "cell",
        "seeds",
        "final accuracy (%)",
        "best accuracy (%)",
        "rounds",
        "MB, all links",
        "simulated time (s)",
        "simulated energy (J)",
        "epsilon",
        "stopped by",
    ]
    rows = []
    for cell in cells:
        done = [r.summary for r in cell.finished]
        stopped = ", ".join(sorted({s.get("stopped_by", "rounds") for s in done})) or "–"
        rows.append(
            [
                cell.label,
                f"{len(done)}/{len(cell.runs)}",
                _pm([s["final_accuracy"] for s in done], 2, 100),
                _pm([s["best_accuracy"] for s in done], 2, 100),
                _pm([s["rounds"] for s in done], 1),
                _pm([s["mb_total"] for s in done], 3),
                _pm([s["sim_seconds"] for s in done], 3),
                _pm([s["sim_joules"] for s in done], 3),
                _epsilons(done),
                stopped,
            ]
            + ([_pm([s["final_perplexity"] for s in done], 3)] if perplexity else [])
        )
    return _table(head + ["final perplexity"] * perplexity, rows)


def _epsilons(summaries: list[Any]) -> str:
    """The cell's privacy-ledger epsilon over its seeds ("none": a run with no privacy mechanism)."""
    values = [s.get("epsilon") for s in summaries]
    if not values or any(v is None for v in values):
        return "none"
    return _pm([float(v) for v in values], 3)


def energy_models(cells: list[Cell]) -> str:
    """Each distinct energy model of the cells' runs (:func:`fedge.system.model.energy_assumption`), with
    the cells that use it where they differ (a run whose ``system`` block this fedge no longer reads is
    pointed to its config)."""
    from pydantic import ValidationError

    from fedge.config import SystemConfig  # pydantic and torch: only for a report that has joules
    from fedge.system.model import energy_assumption

    used: dict[str, list[str]] = defaultdict(list)
    for cell in cells:
        try:
            system = SystemConfig.model_validate(cell.runs[0].config.get("system") or {})
        except ValidationError:
            used[f"the system block of {results.CONFIG}"].append(cell.label)
            continue
        used[energy_assumption(system)].append(cell.label)
    if len(used) == 1:
        return html.escape(next(iter(used)))
    parts = (f"{', '.join(labels)}: {text}" for text, labels in used.items())
    return html.escape("; ".join(parts))


def breakdown_tables(cells: list[Cell]) -> str:
    """Each cell's mean simulated seconds by phase along the critical path, and joules by phase and by
    node tier (runs from before the breakdown show dashes)."""
    out = []
    for key, title, unit in (
        ("sim_seconds_by_phase", "time on the critical path", "s"),
        ("sim_joules_by_phase", "energy by phase", "J"),
        ("sim_joules_by_tier", "energy by node tier", "J"),
    ):
        means = {c.label: _mean_dicts([r.summary.get(key, {}) for r in c.finished]) for c in cells}
        parts = list(dict.fromkeys(p for row in means.values() for p in row))
        if not parts:
            continue
        rows = [
            [label, *(f"{row[p]:.4g}" if p in row else "–" for p in parts)] for label, row in means.items()
        ]
        out.append(f"<h3>{title}</h3>" + _table(["cell", *(f"{p} ({unit})" for p in parts)], rows))
    return "".join(out)


def target_table(cells: list[Cell], levels: list[float]) -> str:
    head = ["cell", "target accuracy", "reached (seeds)", "rounds", "MB, all links", "simulated time (s)"]
    rows = []
    for level in levels:
        for cell in cells:
            hits = [h for h in (_first_hit(r.rows, level) for r in cell.runs) if h]
            rows.append(
                [
                    cell.label,
                    f"{100 * level:g} %",
                    f"{len(hits)}/{len(cell.runs)}",
                    _pm([h["round"] for h in hits], 1),
                    _pm([h["mb_total"] for h in hits], 3),
                    _pm([h["sim_seconds"] for h in hits], 3),
                ]
            )
    return _table(head, rows)


def diff_table(cells: list[Cell]) -> str:
    diff = config_diff([c.runs[0].config for c in cells], ignore=("seed",))
    if not diff:
        return "<p>The runs share one config (apart from their seeds).</p>"
    head = ["config key", *(c.label for c in cells)]
    rows = [[key, *("–" if v is None else json.dumps(v) for v in values)] for key, values in diff.items()]
    return _table(head, rows)


def _style() -> str:
    return """<style>
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1180px;margin:2em auto;
padding:0 1.2em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em} h2{font-size:1.3em;margin-top:1.8em;border-bottom:2px solid #0072B2;
padding-bottom:.2em} h3{font-size:1.05em;margin-top:1.2em}
.meta{color:#555;font-size:.92em} figure{margin:1em 0} figcaption{color:#444;font-size:.9em}
img{max-width:100%} table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em} th{background:#eef4fa;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap} td.txt{text-align:left}
tbody tr:nth-child(even){background:#f7f7f7} details{margin:.5em 0} pre{background:#f4f4f4;padding:.8em;
overflow-x:auto;font-size:.85em} code{font-size:.92em}
</style>"""


def _arguments(paths: str | Path | Sequence[str | Path]) -> list[str | Path]:
    return [paths] if isinstance(paths, str | Path) else list(paths)


def _home(paths: list[str | Path], runs: list[Run]) -> Path:
    """The folder a report is of: the one directory given, else the runs' common folder."""
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return Path(paths[0])
    return Path(os.path.commonpath([r.path.resolve() for r in runs]))


def render(paths: str | Path | Sequence[str | Path], targets: list[float] | None = None) -> str:
    """The report page of the runs that ``paths`` name (:func:`find_runs`), as HTML text."""
    arguments = _arguments(paths)
    runs = find_runs(arguments)
    path = _home(arguments, runs)
    cells = group_cells(runs)
    finished = [c for c in cells if c.finished]
    levels = _targets(cells, targets)
    kind = "run" if len(runs) == 1 else "sweep" if (Path(path) / "sweep.yaml").is_file() else "runs"
    first = runs[0].config
    title = f"fedge report · {Path(path).resolve().name}"
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        _style(),
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    dataset = html.escape(str(first.get("data", {}).get("name")))
    parts.append(
        f"<p class='meta'>{len(runs)} run(s) in {len(cells)} cell(s) · dataset <b>{dataset}</b> · "
        f"{first.get('partition', {}).get('num_clients')} clients · up to {first.get('rounds')} rounds"
        f" · {kind} at <code>{html.escape(str(Path(path).resolve()))}</code></p>"
    )
    parts.append("<h2>Results</h2>")
    parts.append(
        "<p>Mean ± sample standard deviation over seeds; costs are cumulative at each run's last round.</p>"
    )
    parts.append(headline_table(cells))
    if finished:
        parts.append("<h2>Simulated time and energy by phase</h2>")
        parts.append(
            "<p>From the wireless system model, mean over seeds: the seconds of each round's critical path "
            "(its slowest participant, or a shared server's compute when that is longer) by phase, and "
            "every node's joules by phase and by tier (clients, edge servers, server, cloud). Energy model "
            f"(the <code>system</code> block): {energy_models(finished)}.</p>"
        )
        parts.append(breakdown_tables(finished))
    parts.append("<h2>Accuracy against rounds, communication and simulated time</h2>")
    parts.append(
        f"<figure><img alt='accuracy curves' src='{accuracy_figure(cells)}'><figcaption>Test accuracy at "
        "evaluated rounds; a line is the mean over a cell's seeds, the band ± one standard deviation. "
        "MB = 2<sup>20</sup> bytes over all links; simulated time from the wireless system model."
        "</figcaption></figure>"
    )
    parts.append(lm_section(cells, _figure_uri, _table))
    parts.append(selection_section(cells, _figure_uri))
    parts.append(attacks_section(cells, _table))
    if levels:
        parts.append("<h2>Time to target accuracy</h2>")
        parts.append(
            "<p>The first evaluated round at or above the target, per seed; mean ± std over the seeds "
            "that reached it.</p>"
        )
        parts.append(target_table(cells, levels))
    if finished:
        parts.append("<h2>Cost per link</h2>")
        per_link = {c.label: _mean_dicts([link_costs(r) for r in c.finished]) for c in finished}
        parts.append(
            f"<figure><img alt='cost per link' src='{links_figure(finished, per_link)}'><figcaption>"
            "Communicated MB per ledger kind and direction (up: towards the server or cloud)."
            "</figcaption></figure>"
        )
        links = list(dict.fromkeys(link for row in per_link.values() for link in row))
        rows = [[c.label, *(f"{per_link[c.label].get(link, 0.0):.3f}" for link in links)] for c in finished]
        parts.append(_table(["cell", *(f"{link}, MB" for link in links)], rows))
        parts.append("<h2>Cost per node</h2>")
        parts.append(
            "<p>Traffic each node sent and received and the most it stored at once (model copies, "
            "auxiliary heads), in MB, for the first seed of each cell.</p>"
        )
        for cell in finished:
            nodes = _aggregate_clients(node_costs(cell.finished[0]))
            parts.append(f"<h3>{html.escape(cell.label)}</h3>")
            parts.append(
                _table(
                    ["node", "sent (MB)", "received (MB)", "peak storage (MB)", "simulated energy (J)"],
                    [
                        [
                            n["node"],
                            f"{n['sent']:.3f}",
                            f"{n['received']:.3f}",
                            f"{n['peak']:.3f}",
                            f"{n['energy']:.4g}",
                        ]
                        for n in nodes
                    ],  # fmt: skip
                )
            )
    if len(cells) > 1:
        parts.append("<h2>Config diff between cells</h2>")
        parts.append(diff_table(cells))
    parts.append("<h2>Runs</h2>")
    rows = [
        [
            c.label,
            r.seed,
            _relative(r.path, path),
            "finished" if r.summary else "unfinished",
            f"{100 * r.summary['final_accuracy']:.2f}" if r.summary else "–",
        ]
        for c in cells
        for r in c.runs
    ]
    parts.append(_table(["cell", "seed", "directory", "state", "final accuracy (%)"], rows, numeric_from=4))
    config_text = html.escape(yaml.safe_dump(first, sort_keys=False))
    parts.append(f"<details><summary>Config of the first run</summary><pre>{config_text}</pre></details>")
    environment = runs[0].path / "environment.json"
    if environment.is_file():
        parts.append(
            f"<details><summary>Environment</summary><pre>{html.escape(environment.read_text())}</pre></details>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def _relative(run_dir: Path, home: Path) -> str:
    """A run's directory as the report names it: relative to the report's folder where it lies inside."""
    run_dir, home = run_dir.resolve(), home.resolve()
    if run_dir == home:
        return "."
    return str(run_dir.relative_to(home)) if run_dir.is_relative_to(home) else str(run_dir)


def _mean_dicts(items: list[dict[str, float]]) -> dict[str, float]:
    keys = list(dict.fromkeys(k for item in items for k in item))
    return {k: statistics.fmean(item.get(k, 0.0) for item in items) for k in keys}


def write_report(
    paths: str | Path | Sequence[str | Path], out: Path | None = None, targets: list[float] | None = None
) -> Path:
    """Write the report of the runs ``paths`` name to ``out`` (default: ``report.html`` in the one
    directory given, else in the runs' common folder); the file written."""
    arguments = _arguments(paths)
    page = render(arguments, targets)
    out = Path(out) if out is not None else _home(arguments, find_runs(arguments)) / REPORT
    results.write_text(out, page)
    return out
