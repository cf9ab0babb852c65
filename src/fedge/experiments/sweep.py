"""Sweeps: one config over a grid of settings and a list of seeds, one run directory per cell and seed.

A sweep is a base config plus a ``sweep:`` block (or the same from the command line)::

    sweep:
      grid: {algorithm.name: [cse_fsl, splitfed_v2], algorithm.h: [1, 2, 5]}   # a product
      cells: {"FSL_MC": {algorithm.name: splitfed_v1}}   # or labelled settings (times the grid)
      seeds: [1, 2, 3]
      jobs: 2
      name: split-h
      base: split-mnist.yaml   # optional: the config this file's other keys override

Every cell's algorithm block keeps only the keys its algorithm knows (as ``fedge compare`` does), so
``algorithm.h`` applies to CSE-FSL and not to SplitFed; cells that become the same config are one cell.
Runs go to ``output.dir/<name>/runs/<cell>-s<seed>/``, in ``jobs`` processes. Running the same sweep
again continues it: finished runs are skipped and interrupted ones resumed from their checkpoint, so a
killed sweep ends with the same ``results.csv`` as an uninterrupted one. Running it again with another
``rounds`` gives every run that length: finished runs go on to the new last round where their algorithm
allows (:mod:`fedge.runner.run_length`), so a sweep capped too early is continued, not rerun. ``index.csv``
lists every run and its state, ``results.csv`` has one row of computed figures per finished run (no wall
time, so it is reproducible), and ``table.csv`` / ``table.md`` the mean, standard deviation and 95 %
interval per cell.
"""

from __future__ import annotations

import copy
import csv
import functools
import io
import itertools
import math
import os
import re
import statistics
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from pydantic import Field, PositiveInt, ValidationError

from fedge.config import DEFAULT_ALGORITHM, StrictModel, load_raw, split_values
from fedge.errors import ConfigError, FedgeError, PathError
from fedge.experiments.labels import short_keys
from fedge.files import results
from fedge.intake.precheck import algorithm_keys, known_names, precheck
from fedge.runner import stop

SWEEP_FILE = "sweep.yaml"
INDEX = "index.csv"
RESULTS = "results.csv"
TABLE = "table.csv"
RUNS = "runs"
SUMMARY_FIELDS = (
    "rounds",
    "final_accuracy",
    "best_accuracy",
    "best_round",
    "final_loss",
    "mb_up",
    "mb_down",
    "mb_total",
    "bits_up",
    "bits_down",
    "bits_peer",
    "storage_server_bits",
    "storage_client_bits",
    "sim_seconds",
    "sim_joules",
    "epsilon",
    "stopped_by",
    "malicious",
    "malicious_kept",
    "malicious_selected",
    "final_attack_success",
)
TABLE_FIELDS = ("final_accuracy", "best_accuracy", "mb_total", "sim_seconds")


class SweepSpec(StrictModel):
    """The ``sweep:`` block: what varies (a grid of dotted keys, labelled cells), seeds, processes."""

    base: str | None = None  # a config file (relative to this one) that the file's own keys override
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    cells: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    jobs: PositiveInt = 1
    name: str | None = None


@dataclass
class Cell:
    """One setting of the sweep: its label, the overrides that apply, and its directory stem."""

    label: str
    overrides: dict[str, Any]
    slug: str
    group: str  # the labelled cell it comes from ("" without ``cells``)
    raw: dict[str, Any] = field(repr=False)
    dropped: list[str] = field(default_factory=list)


@dataclass
class Task:
    """One run: a cell at a seed, its run directory and the length the sweep gives it."""

    cell: Cell
    seed: int
    run_dir: Path
    rounds: int

    def state(self) -> str:
        if (self.run_dir / results.SUMMARY).is_file():
            return "done"
        return "interrupted" if (self.run_dir / results.CONFIG).is_file() else "pending"

    def work_left(self) -> float:
        """The share of the run's length still to run, which the sweep's ETA weighs runs by: 1 for a
        run not started, 0 for one a stop rule ended (it stays stopped)."""
        import json

        state = self.state()
        if state == "pending":
            return 1.0
        if state == "done":
            summary = json.loads((self.run_dir / results.SUMMARY).read_text())
            if summary.get("stopped_by", "rounds") != "rounds":
                return 0.0
            done = summary["rounds"]
        else:
            try:
                rows = results.read_jsonl(self.run_dir / results.METRICS)
            except PathError:  # none yet, or a line torn by the kill: count the run as not started
                rows = []
            done = rows[-1].get("round", 0) if rows else 0
        return max(0.0, 1.0 - done / self.rounds)

    def to_do(self) -> bool:
        """Whether the run is unfinished, or finished with another length than the sweep's."""
        if self.state() != "done":
            return True
        return load_raw(self.run_dir / results.CONFIG)["rounds"] != self.rounds


@dataclass
class SweepResult:
    """A finished sweep: its directory, runs, one result row per run and the per-cell table."""

    sweep_dir: Path
    tasks: list[Task]
    rows: list[dict[str, Any]]
    table: list[dict[str, Any]]


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in a nested dict (creating blocks) to ``value``."""
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(key, f"{part} is not a block; cannot set a key inside it")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def parse_values(text: str) -> list[Any]:
    """``v1,v2,...`` (each read as YAML, commas inside brackets kept) into a list of values."""
    return [yaml.safe_load(value) for value in split_values(text)]


def _retarget(raw: dict[str, Any], names: dict[str, Any]) -> list[str]:
    """Drop the algorithm keys the named algorithm does not know but another algorithm does (a grid over
    algorithms sets each one's own keys); return them (dotted). A key no algorithm knows is a typo: kept,
    for the check to refuse."""
    block = raw.get("algorithm") or {}
    known = algorithm_keys(block.get("name", DEFAULT_ALGORITHM), names)
    if known is None:
        return []
    foreign = [k for k in block if k not in known]
    if foreign:
        others = {key for name in names["algorithms"] for key in algorithm_keys(name, names) or []}
        foreign = [k for k in foreign if k in others]
    dropped = sorted(foreign)
    for key in dropped:
        del block[key]
    return [f"algorithm.{k}" for k in dropped]


def _parse(raw: dict[str, Any]) -> Any:
    """The full check of a run config, plugins registered (imports the algorithms, so torch)."""
    from fedge.extend import parse_config

    return parse_config(raw)


def _slug(overrides: dict[str, Any], label: str | None) -> str:
    if label:
        text = label
    else:
        text = "-".join(
            f"{v}" if k.endswith(".name") else f"{k.split('.')[-1]}{v}" for k, v in overrides.items()
        )
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_") or "base"


def expand(base: dict[str, Any], spec: SweepSpec) -> list[Cell]:
    """The sweep's cells: labelled cells times the grid's product, retargeted and deduplicated."""
    labelled = list(spec.cells.items()) or [("", {})]
    keys = list(spec.grid)
    names = known_names()
    cells: list[Cell] = []
    seen: dict[str, Cell] = {}
    for (label, fixed), values in itertools.product(labelled, itertools.product(*spec.grid.values())):
        overrides = {**fixed, **dict(zip(keys, values, strict=True))}
        raw = copy.deepcopy(base)
        for key, value in overrides.items():
            set_dotted(raw, key, value)
        dropped = _retarget(raw, names)
        applied = {k: v for k, v in overrides.items() if k not in dropped}
        identity = yaml.safe_dump(raw, sort_keys=True)
        if identity in seen:
            continue
        short = short_keys(list(spec.grid))
        grid_part = ", ".join(
            f"{v}" if k == "algorithm.name" else f"{short[k]}={v}"
            for k, v in applied.items()
            if k in spec.grid
        )
        full = ", ".join(part for part in (label, grid_part) if part) or "base"
        slug = _slug({k: v for k, v in applied.items() if k in spec.grid}, label)
        if label and grid_part:
            slug = f"{slug}-{_slug({k: v for k, v in applied.items() if k in spec.grid}, None)}"
        while any(c.slug == slug for c in cells):
            slug += "_"
        cell = Cell(full, applied, slug, label, raw, dropped)
        seen[identity] = cell
        cells.append(cell)
    return cells


def load_sweep(
    config: str | Path | None,
    overrides: list[str] | None = None,
    grid: list[str] | None = None,
    seeds: list[int] | None = None,
    jobs: int | None = None,
    name: str | None = None,
) -> tuple[dict[str, Any], SweepSpec]:
    """The base config (a dict) and the sweep spec of a YAML file's ``sweep:`` block plus options.

    ``config`` may also be a sweep directory: its ``sweep.yaml`` is read, so the sweep continues.
    """
    from fedge.config import apply_override
    from fedge.intake.locate import config_source

    path = config_source(config) if config is not None else None
    if path is not None and path.is_dir():
        path = path / SWEEP_FILE
        if not path.is_file():
            raise FedgeError(f"{path.parent}: not a sweep directory (no {SWEEP_FILE})")
    raw = load_raw(path)
    block = raw.pop("sweep", None) or {}
    if block.get("base"):
        raw = _merge(load_raw(Path(path).parent / block.pop("base")), raw)
    for assignment in overrides or []:
        apply_override(raw, assignment)
    for text in grid or []:
        key, _, values = text.partition("=")
        if not key or not values:
            raise ConfigError(text, "a grid axis looks like key=v1,v2,...")
        block.setdefault("grid", {})[key.strip()] = parse_values(values)
    for key, value in (("seeds", seeds), ("jobs", jobs), ("name", name)):
        if value is not None:
            block[key] = value
    try:
        spec = SweepSpec.model_validate(block)
    except ValidationError as error:
        first = error.errors()[0]
        raise ConfigError("sweep." + ".".join(map(str, first["loc"])), first["msg"]) from None
    if spec.name is None:
        stem = Path(path).stem if path is not None else "quickstart"
        spec.name = f"sweep-{stem}"
    return raw, spec


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys set on it, blocks merged key by key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def plan(base: dict[str, Any], spec: SweepSpec) -> tuple[Path, list[Task]]:
    """Validate every run's config (before anything runs) and give each its run directory."""
    cells = expand(base, spec)
    sweep_dir = Path((base.get("output") or {}).get("dir", "runs")) / spec.name
    runs = []
    for cell in cells:
        for seed in spec.seeds:
            run_name = f"{cell.slug}-s{seed}"
            raw = copy.deepcopy(cell.raw)
            raw["seed"] = seed
            raw.setdefault("output", {}).update(dir=str(sweep_dir / RUNS), name=run_name)
            runs.append((cell, seed, sweep_dir / RUNS / run_name, raw))
    names = known_names()
    for cell, *_, raw in runs:  # every config's schema first, before torch loads
        _in_cell(cell, functools.partial(precheck, raw, names=names))
    tasks = [
        Task(cell, seed, run_dir, _in_cell(cell, lambda raw=raw: _parse(copy.deepcopy(raw))).rounds)
        for cell, seed, run_dir, raw in runs
    ]
    return sweep_dir, tasks


def _in_cell(cell: Cell, check: Callable[[], Any]) -> Any:
    """``check()``'s result; a config error it raises names ``cell``."""
    try:
        return check()
    except ConfigError as error:
        raise ConfigError(error.key, f"{error.message} (cell {cell.label})") from None


def _identity(base: dict[str, Any], spec: SweepSpec) -> str:
    """What makes two sweeps the same (``jobs`` and ``rounds`` may change between sessions)."""
    kept = {key: value for key, value in base.items() if key != "rounds"}
    return yaml.safe_dump({"base": kept, "sweep": spec.model_dump(exclude={"jobs"})}, sort_keys=False)


def _claim(sweep_dir: Path, base: dict[str, Any], spec: SweepSpec) -> None:
    """Create the sweep directory, or check that the one there holds this same sweep."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    saved = sweep_dir / SWEEP_FILE
    text = yaml.safe_dump({**base, "sweep": spec.model_dump(mode="json")}, sort_keys=False)
    if saved.is_file():
        old = yaml.safe_load(saved.read_text())
        old_spec = SweepSpec.model_validate(old.pop("sweep"))
        if _identity(old, old_spec) != _identity(base, spec):
            raise FedgeError(f"{sweep_dir}: holds a different sweep; choose another name (--name)")
    results.write_text(saved, text)


def _parent_watch(parent: int, threads: int | None) -> None:
    """Worker start-up: die with the sweep process (Linux), and share the cores between workers."""
    from fedge.distributed.lifeline import die_with_parent

    die_with_parent(parent)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def run_task(task: Task) -> dict[str, Any]:
    """Run (or resume) one task to its end; its summary."""
    from fedge.runner.loop import open_run, start_run

    if task.state() != "pending":
        return open_run(task.run_dir, rounds=task.rounds).run().summary
    raw = copy.deepcopy(task.cell.raw)
    raw["seed"] = task.seed
    raw.setdefault("output", {}).update(dir=str(task.run_dir.parent), name=task.run_dir.name)
    runner = start_run(_parse(raw))
    if runner.run_dir != task.run_dir:
        raise FedgeError(f"{task.run_dir}: run directory taken by another process")
    return runner.run().summary


def _csv(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    out = io.StringIO()
    columns = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _cell_value(value: Any) -> Any:
    return repr(value) if isinstance(value, float) else value


def result_row(task: Task, summary: dict[str, Any], targets: list[float]) -> dict[str, Any]:
    """The computed figures of one run (nothing wall-clock: a rerun gives the same row)."""
    row: dict[str, Any] = {"cell": task.cell.slug, "label": task.cell.label, "seed": task.seed}
    row.update({k: _cell_value(v) for k, v in task.cell.overrides.items()})
    row["run"] = f"{RUNS}/{task.run_dir.name}"
    row.update({k: _cell_value(summary.get(k)) for k in SUMMARY_FIELDS})
    for level in targets:
        reached = summary.get("time_to_target", {}).get(f"{level:g}") or {}
        for key, column in (("round", "rounds"), ("mb_total", "mb"), ("sim_seconds", "sim_seconds")):
            row[f"{column}_to_{level:g}"] = _cell_value(reached.get(key))
    return row


def interval(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation and the half-width of the 95 % t interval of ``values``."""
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    if n > 1:
        from scipy.special import stdtrit  # the t quantile (scipy.stats takes a second to import)

        half = float(stdtrit(n - 1, 0.975)) * std / math.sqrt(n)
    else:
        half = math.nan
    return {"mean": mean, "std": std, "ci95": half, "n": n}


def paired_verdict(differences: list[float]) -> dict[str, Any]:
    """The mean of paired differences (same seed on both sides), its 95 % t interval ``low``..``high``
    and the verdict: ``within noise`` where the interval holds zero, else ``higher`` or ``lower``.

    One helper so every experiment script words a claim the same way; fewer than two pairs give no
    interval (``nan``) and the verdict ``one seed``."""
    figures = interval(differences)
    low, high = figures["mean"] - figures["ci95"], figures["mean"] + figures["ci95"]
    if figures["n"] < 2:
        word = "one seed"
    else:
        word = "within noise" if low <= 0 <= high else "higher" if low > 0 else "lower"
    return {"mean": figures["mean"], "low": low, "high": high, "n": figures["n"], "verdict": word}


def paired_text(differences: list[float]) -> str:
    """``+1.23 [+0.45, +2.01] higher``: :func:`paired_verdict` as one cell of a table (``+1.23 one seed``
    where one pair gives no interval to print)."""
    v = paired_verdict(differences)
    if v["n"] < 2:
        return f"{v['mean']:+.2f} {v['verdict']}"
    return f"{v['mean']:+.2f} [{v['low']:+.2f}, {v['high']:+.2f}] {v['verdict']}"


def cell_table(tasks: list[Task], summaries: dict[Path, dict[str, Any]], targets: list[float]) -> list[dict]:
    """Per cell: mean, std and 95 % interval over seeds of the headline figures and time to target."""
    table = []
    for cell in dict.fromkeys(task.cell.slug for task in tasks):
        group = [summaries[t.run_dir] for t in tasks if t.cell.slug == cell and t.run_dir in summaries]
        if not group:
            continue
        label = next(t.cell.label for t in tasks if t.cell.slug == cell)
        entry: dict[str, Any] = {"cell": cell, "label": label, "seeds": len(group)}
        for key in TABLE_FIELDS:
            stats = interval([s[key] for s in group])
            entry.update({f"{key}_{part}": value for part, value in stats.items() if part != "n"})
        for level in targets:
            hits = [s["time_to_target"].get(f"{level:g}") for s in group]
            hits = [h for h in hits if h]
            entry[f"reached_{level:g}"] = len(hits)
            for key in ("round", "mb_total", "sim_seconds"):
                values = [h[key] for h in hits]
                stats = interval(values) if values else {"mean": math.nan, "std": math.nan, "ci95": math.nan}
                entry.update({f"{key}_to_{level:g}_{part}": stats[part] for part in ("mean", "std", "ci95")})
        table.append(entry)
    return table


def table_markdown(table: list[dict[str, Any]], targets: list[float]) -> str:
    """The per-cell table as markdown: mean ± std over seeds, then [± half-width of the 95 % interval]."""

    def pm(entry: dict[str, Any], key: str, scale: float = 1.0, digits: int = 2) -> str:
        mean, std, half = (entry[f"{key}_{p}"] * scale for p in ("mean", "std", "ci95"))
        if math.isnan(mean):
            return "-"
        if math.isnan(half):  # one seed: no spread to show
            return f"{mean:.{digits}f}"
        ci = f" [±{half:.{digits}f}]" if not math.isnan(half) else ""
        return f"{mean:.{digits}f} ± {std:.{digits}f}{ci}"

    head = ["cell", "seeds", "final accuracy %", "best accuracy %", "MB (all links)", "simulated s"]
    for level in targets:
        head += [f"rounds to {100 * level:g} %", f"MB to {100 * level:g} %", f"sim. s to {100 * level:g} %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in table:
        cells = [e["label"], str(e["seeds"]), pm(e, "final_accuracy", 100), pm(e, "best_accuracy", 100)]
        cells += [pm(e, "mb_total", digits=3), pm(e, "sim_seconds", digits=3)]
        for level in targets:
            reached = f" ({e[f'reached_{level:g}']}/{e['seeds']})"
            cells += [
                pm(e, f"round_to_{level:g}", digits=1) + reached,
                pm(e, f"mb_total_to_{level:g}", digits=3),
                pm(e, f"sim_seconds_to_{level:g}", digits=3),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _write_index(sweep_dir: Path, tasks: list[Task], wall: dict[Path, float]) -> None:
    rows = [
        {
            "cell": t.cell.slug,
            "label": t.cell.label,
            "seed": t.seed,
            "run": f"{RUNS}/{t.run_dir.name}",
            "state": t.state(),
            "wall_seconds": wall.get(t.run_dir, ""),
            "dropped_keys": " ".join(t.cell.dropped),
        }
        for t in tasks
    ]
    results.write_text(sweep_dir / INDEX, _csv(rows))


class FinishedRun(NamedTuple):
    """A finished run of a sweep: its ``index.csv`` entry (cell, label, seed, ...), directory and
    ``summary.json``."""

    entry: dict[str, str]
    path: Path
    summary: dict[str, Any]


def finished_runs(sweep_dir: Path) -> list[FinishedRun]:
    """The runs of a sweep directory that finished. A run still going, killed or stopped as diverged is
    left out: its last round is not where it ends."""
    import json

    index = Path(sweep_dir) / INDEX
    if not index.is_file():
        raise FedgeError(f"{sweep_dir}: not a sweep directory (no {INDEX})")
    out = []
    with index.open() as handle:
        for entry in csv.DictReader(handle):
            run = Path(sweep_dir) / entry["run"]
            path = run / results.SUMMARY
            summary = json.loads(path.read_text()) if path.is_file() else {}
            if summary.get("status") == "finished":
                out.append(FinishedRun(entry, run, summary))
    return out


def collect(sweep_dir: Path, tasks: list[Task], targets: list[float]) -> SweepResult:
    """Read every finished run's summary and write ``results.csv``, ``table.csv`` and ``table.md``."""
    import json

    summaries = {
        t.run_dir: json.loads((t.run_dir / results.SUMMARY).read_text()) for t in tasks if t.state() == "done"
    }
    rows = [result_row(t, summaries[t.run_dir], targets) for t in tasks if t.run_dir in summaries]
    table = cell_table(tasks, summaries, targets)
    results.write_text(sweep_dir / RESULTS, _csv(rows))
    results.write_text(sweep_dir / TABLE, _csv(table))
    results.write_text(sweep_dir / "table.md", table_markdown(table, targets))
    _write_index(
        sweep_dir,
        tasks,
        {t.run_dir: summaries[t.run_dir]["wall_seconds"] for t in tasks if t.run_dir in summaries},
    )
    return SweepResult(sweep_dir, tasks, rows, table)


Announce = Callable[[Task, int, int, float | None], None]


def run_sweep(base: dict[str, Any], spec: SweepSpec, on_done: Announce | None = None) -> SweepResult:
    """Run (or continue) a sweep to the end; ``on_done(task, done, total, eta_seconds)`` after each run."""
    sweep_dir, tasks = plan(base, spec)
    _claim(sweep_dir, base, spec)
    targets = stop.targets(_parse(tasks[0].cell.raw).stop)
    todo = [t for t in tasks if t.to_do()]
    left = {t.run_dir: t.work_left() for t in todo}  # runs' shares of their length; the ETA's weights
    done, total, ran, began = len(tasks) - len(todo), len(tasks), 0.0, time.monotonic()
    _write_index(sweep_dir, tasks, {})

    def finished(task: Task) -> None:
        nonlocal done, ran
        done += 1
        ran += left.pop(task.run_dir)
        eta = (time.monotonic() - began) / ran * sum(left.values()) if ran else None
        if on_done is not None:
            on_done(task, done, total, eta)
        _write_index(sweep_dir, tasks, {})

    if spec.jobs == 1 or len(todo) <= 1:
        for task in todo:
            run_task(task)
            finished(task)
    else:
        from multiprocessing import get_context

        from fedge.engine.host import available_cores

        threads = max(1, available_cores() // spec.jobs)
        pool = ProcessPoolExecutor(
            spec.jobs,
            mp_context=get_context("spawn"),
            initializer=_parent_watch,
            initargs=(os.getpid(), threads),
        )
        with pool:
            running = {pool.submit(run_task, task): task for task in todo}
            while running:
                complete, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in complete:
                    task = running.pop(future)
                    future.result()
                    finished(task)
    return collect(sweep_dir, tasks, targets)
