"""The ``fedge`` command line: run, resume, sweep, compare, report, list, schema, plot, bounds, deploy.

Bad input (an unknown key, an impossible value, a missing or unwritable file, a damaged checkpoint, a run
too large for the machine's memory) prints one line ``error: <key or file>: <message>`` and exits with
code 2; no results directory is created for it. A run stopped by a NaN or infinite number prints one
line and exits with code 3. A usage error (an unknown command or option, a missing argument) is one line
naming it, exit code 2, not click's usage box. The heavy modules (torch, the runner,
matplotlib) are imported inside the commands, so ``--help``, ``--version`` and ``list`` answer at once.
When output goes to a file or a pipe, tables are printed at their full width (no cut headers), and
the commands that print tables also take ``--json``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

import fedge
from fedge.cli.bounds import bounds
from fedge.cli.deploy import deploy
from fedge.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, Diverged, FedgeError

if TYPE_CHECKING:
    from fedge.runner.loop import Result, Runner

PIPE_WIDTH = 250  # columns of a table printed to a file or a pipe


def _console(stderr: bool = False) -> Console:
    """A console that keeps whole tables when it does not write to a terminal."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=PIPE_WIDTH)


def usage_line(error: click.UsageError) -> str:
    """A usage error (unknown command or option, missing or bad argument) as one line naming it and the
    help that lists what is valid; click's own is a usage line, a hint and a boxed message."""
    path = " ".join(["fedge", *(error.ctx.command_path.split()[1:] if error.ctx is not None else [])])
    message = error.format_message().strip().rstrip(".")
    message = message[:1].lower() + message[1:]
    lists = message.startswith(("no such command", "missing command", "no such option"))
    return f"{path}: {message} ({path} --help{' lists them' if lists else ''})"


class OneLineUsage(TyperGroup):
    """The ``fedge`` command group, with its usage errors in one line and exit code 2."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _usage_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_in_one_line(), _notes_in_one_line():
            return super().invoke(ctx)


@contextmanager
def _usage_in_one_line() -> Iterator[None]:
    try:
        yield
    except click.UsageError as error:
        click.echo(usage_line(error), err=True)
        raise click.exceptions.Exit(EXIT_BAD_INPUT) from None


@contextmanager
def _notes_in_one_line() -> Iterator[None]:
    """A config reader's note (keys dropped on switching algorithms) as one ``note:`` line, once, from
    the process that prints (rank 0 of a launched run); other warnings as Python shows them."""
    with warnings.catch_warnings():
        python_shows = warnings.showwarning
        noted: set[str] = set()  # a config is read twice (the quick check, then the run)

        def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            from fedge.intake.locate import DroppedKeys

            if not issubclass(category, DroppedKeys):
                python_shows(message, category, *args, **kwargs)
            elif str(message) not in noted and _rank_zero():
                noted.add(str(message))
                errors.print(f"note: {_one_line(str(message))}", highlight=False, soft_wrap=True)

        warnings.showwarning = show
        yield


app = typer.Typer(cls=OneLineUsage, add_completion=False, no_args_is_help=False, help=fedge.__doc__)
console = _console()
errors = _console(stderr=True)
app.command("bounds")(bounds)
app.command("deploy")(deploy)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fedge {fedge.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """fedge: resource-efficient federated learning at the wireless edge, with exact cost accounting."""


FORCE_HELP = "run even if the memory pre-flight says the machine cannot hold it"


def _one_line(message: str) -> str:
    """``message`` with control characters (newlines included) written as escapes, never as markup."""
    return escape("".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message))


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    errors.print(f"[bold red]error:[/] {_one_line(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=code)


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure (Python's, NumPy's or a torch allocator's)."""
    text = str(error).lower()
    return isinstance(error, MemoryError) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)
    )


@contextmanager
def _reported() -> Iterator[None]:
    """One line and exit code 2 for bad input (3 for a diverged run) instead of a traceback.

    An allocation failure is reported the same way: the last line of defence behind the memory pre-flight.
    """
    try:
        yield
    except FedgeError as error:
        raise _fail(str(error), error.exit_code) from None
    except Diverged as error:
        raise _fail(str(error), EXIT_DIVERGED) from None
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise _fail(f"memory: the run ran out of memory ({first})") from None


def _run_with_progress(runner: Runner, quiet: bool) -> Result:
    """Run the remaining rounds, showing round, accuracy and MB (a bar, or plain lines when piped)."""
    from fedge.cli.progress import RunProgress

    with RunProgress(console, runner.config.rounds, runner.start, quiet) as progress:
        runner.on_round = progress
        return runner.run()


def _print_summary(result: Result) -> None:
    from fedge.system.model import energy_assumption

    s = result.summary
    table = Table(title=f"fedge · {s['algorithm']} on {s['dataset']}", show_header=False)
    table.add_row("final accuracy", f"{100 * s['final_accuracy']:.2f} % (round {s['rounds']})")
    best = f"{100 * s['best_accuracy']:.2f} % (round {s['best_round']})"
    table.add_row("best accuracy", "= final" if s["best_accuracy"] == s["final_accuracy"] else best)
    if "final_perplexity" in s:  # a language model: accuracy is next-token accuracy
        entropy = f"token cross-entropy {s['final_loss']:.4f}"
        table.add_row("final perplexity", f"{s['final_perplexity']:.3f} ({entropy})")
    table.add_row(
        "communication", f"{s['mb_up']:.3f} MB up, {s['mb_down']:.3f} MB down, {s['mb_peer']:.3f} MB peer"
    )
    for link in sorted(s["ledger_kinds"], key=lambda link: -link["bits"]):
        amount = f"{link['mb']:.3f} MB" if link["mb"] >= 1e-3 else f"{link['bits']:,} bits"
        table.add_row(f"  {link['kind']} ({link['direction']})", amount)
    table.add_row("simulated time", f"{s['sim_seconds']:.2f} s, {s['sim_joules']:.3g} J (wireless model)")
    for label, key, unit in (
        ("  time on the critical path", "sim_seconds_by_phase", "s"),
        ("  energy by phase", "sim_joules_by_phase", "J"),
        ("  energy by node tier", "sim_joules_by_tier", "J"),
    ):
        if s.get(key):
            table.add_row(label, breakdown_text(s[key], unit))
    table.add_row("  energy model", energy_assumption(result.config.system))
    table.add_row("privacy", privacy_text(s.get("privacy") or {}))
    table.add_row("wall time", f"{s['wall_seconds']:.1f} s")
    if s.get("stopped_by", "rounds") != "rounds":
        table.add_row("stopped by", f"stop.{s['stopped_by']} at round {s['rounds']}")
    for level, reached in s.get("time_to_target", {}).items():
        text = "not reached"
        if reached:
            text = f"round {reached['round']}, {reached['mb_total']:.3f} MB, {reached['sim_seconds']:.3g} s"
        table.add_row(f"to {100 * float(level):g} % accuracy", text)
    table.add_row("results", str(result.run_dir))
    console.print(table)


def privacy_text(privacy: dict[str, Any]) -> str:
    """The privacy ledger's headline: epsilon at delta by its accountant, and each unit's where several
    are spent; a run that released nothing through a mechanism has no guarantee."""
    if privacy.get("epsilon") is None:
        return "no mechanism: no differential-privacy guarantee"
    units = privacy.get("epsilon_by_unit", {})
    shown = f"epsilon {privacy['epsilon']:.3g} at delta {privacy['delta']:g} ({privacy['accountant']})"
    if len(units) > 1:
        shown += "; " + ", ".join(f"{unit} {value:.3g}" for unit, value in units.items())
    return shown


def breakdown_text(figures: dict[str, float], unit: str) -> str:
    """``name value unit (share %)`` for each non-zero part of a breakdown, largest first."""
    total = sum(figures.values())
    parts = sorted(((v, k) for k, v in figures.items() if v > 0), reverse=True)
    return ", ".join(f"{k} {v:.3g} {unit} ({100 * v / total:.0f} %)" for v, k in parts) or "-"


def _split_config_argument(config: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """A first argument that looks like ``key=value`` (and is no file) is an override, not a config."""
    overrides = list(overrides or [])
    if config is not None and "=" in config and not Path(config).exists():
        return None, [config, *overrides]
    return config, overrides


ConfigArgument = Annotated[
    str | None,
    typer.Argument(
        help="YAML config, or example:NAME for a shipped example (omit for the digits quickstart)"
    ),
]
Overrides = Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. rounds=50")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress output")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


Procs = Annotated[
    int,
    typer.Option(
        "--procs", min=1, help="run as this many processes on this host (torchrun; docs/scale-out.md)"
    ),
]


def _launch(procs: int, argv: list[str]) -> None:
    """Run ``fedge ARGV`` as ``procs`` ranks and exit with their outcome (exit code 1 if a rank failed)."""
    from fedge.distributed.launch import run_local

    failed = run_local(procs, argv)
    if failed is not None:
        raise _fail(f"distributed: {failed}", 1)


def _rank_zero() -> bool:
    """Whether this process prints: a plain run, or rank 0 of a launched one."""
    from fedge.distributed.group import launched_rank

    return launched_rank() == 0


@app.command()
def run(
    config: ConfigArgument = None,
    overrides: Overrides = None,
    quiet: Quiet = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    procs: Procs = 1,
) -> None:
    """Run a config (or the built-in quickstart) and write its results directory."""
    from fedge.intake.precheck import precheck

    config, overrides = _split_config_argument(config, overrides)
    with _reported():
        precheck(config, overrides)  # a bad config answers before torch loads
    from fedge.runner.loop import start_run

    if procs > 1:
        with _reported():
            fedge.resolve_config(config, overrides)  # bad input: one line here, not one per rank
        flags = ["--quiet"] * quiet + ["--force"] * force
        return _launch(procs, ["run", *([config] if config else []), *overrides, *flags])
    with _reported():
        runner = start_run(fedge.resolve_config(config, overrides), force=force)
        result = _run_with_progress(runner, quiet or not _rank_zero())
    if _rank_zero():
        _print_summary(result)


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="a run directory with config.yaml and checkpoint.pt")],
    quiet: Quiet = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    procs: Procs = 1,
    rounds: Annotated[
        int | None,
        typer.Option(
            "--rounds",
            help="run to this many rounds: a finished run goes on (refused where the algorithm has a "
            "schedule over the run)",
        ),
    ] = None,
) -> None:
    """Continue an interrupted run from its last checkpoint to the identical result, or a finished one to
    more rounds (--rounds)."""
    from fedge.runner.loop import open_run

    if procs > 1:
        flags = ["--quiet"] * quiet + ["--force"] * force + [f"--rounds={rounds}"] * (rounds is not None)
        return _launch(procs, ["resume", str(run_dir), *flags])
    with _reported():
        runner = open_run(run_dir, force=force, rounds=rounds)
        result = _run_with_progress(runner, quiet or not _rank_zero())
    if _rank_zero():
        _print_summary(result)


def _seed_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise _fail(f"--seeds: a comma-separated list of integers (got {text!r})") from None


@app.command()
def sweep(
    config: Annotated[
        str | None,
        typer.Argument(
            help="YAML config (with or without a sweep: block), example:NAME, or a sweep directory"
        ),
    ] = None,
    overrides: Overrides = None,
    grid: Annotated[
        list[str] | None, typer.Option("--grid", "-g", help="key=v1,v2,... ; repeat for a product")
    ] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", "-s", help="seed list, e.g. 1,2,3")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="runs in parallel processes")] = None,
    name: Annotated[str | None, typer.Option("--name", help="sweep directory name under output.dir")] = None,
    quiet: Quiet = False,
    as_json: AsJson = False,
) -> None:
    """Run a config over a grid of settings and seeds; rerun the same command to continue a killed sweep."""
    from fedge.cli.progress import format_eta
    from fedge.experiments.sweep import load_sweep, run_sweep, table_markdown

    config, overrides = _split_config_argument(config, overrides)

    def announce(task: Any, done: int, total: int, eta: float | None) -> None:
        if not quiet:
            left = total - done
            when = f", ETA {format_eta(eta)}" if eta is not None and left else ""
            console.print(
                f"[{done}/{total}] {task.cell.label} seed {task.seed} done; {left} left{when}",
                highlight=False,
            )

    with _reported():
        base, spec = load_sweep(config, overrides, grid, _seed_list(seeds), jobs, name)
        outcome = run_sweep(base, spec, on_done=announce)
    if as_json:
        typer.echo(json.dumps({"sweep_dir": str(outcome.sweep_dir), "cells": outcome.table}, indent=1))
        return
    from fedge.runner.stop import targets

    levels = targets(fedge.resolve_config(outcome.tasks[0].cell.raw).stop)
    title = f"fedge sweep · {outcome.sweep_dir} · mean ± std over seeds [± 95 % interval]"
    _print_markdown_table(table_markdown(outcome.table, levels), title)


def _print_markdown_table(markdown: str, title: str) -> None:
    """Print a markdown table (header, rule, rows) as a rich table."""
    lines = [line.strip().strip("|").split(" | ") for line in markdown.strip().splitlines()]
    table = Table(title=title)
    for column in lines[0]:
        table.add_column(column.strip(), justify="left" if column.strip() in ("cell", "method") else "right")
    for row in lines[2:]:
        table.add_row(*(cell.strip() for cell in row))
    console.print(table)


@app.command()
def compare(
    config: Annotated[
        str | None,
        typer.Argument(
            help="YAML config shared by every algorithm, or finished runs: a run, sweep or compare "
            "directory, or a glob"
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="dotted overrides (e.g. rounds=50; algorithm.KEY=V goes to the algorithms that have KEY), "
            "or more runs"
        ),
    ] = None,
    algorithms: Annotated[str, typer.Option("--algorithms", "-a", help="comma-separated names")] = "fedavg",
    seeds: Annotated[str, typer.Option("--seeds", "-s", help="a count (3) or a list (1,2,3)")] = "1",
    target: Annotated[
        float | None, typer.Option("--target", "-t", help="accuracy (0-1): rounds / MB / sim. s to reach it")
    ] = None,
    quiet: Quiet = False,
    as_json: AsJson = False,
) -> None:
    """Run several algorithms on one config over seeds (or read finished runs) and print a table."""
    from fedge.intake.precheck import check_algorithm_overrides, precheck, split_algorithm_overrides
    from fedge.report.rundirs import find_run_dirs, names_runs

    config, overrides = _split_config_argument(config, overrides)
    paths = [p for p in [config, *overrides] if p is not None]
    with _reported():
        if names_runs(paths):
            from fedge.experiments.compare import compare_runs

            outcome = compare_runs(find_run_dirs(paths), target)
        else:
            names = [name.strip() for name in algorithms.split(",") if name.strip()]
            per_algorithm, shared = split_algorithm_overrides(overrides)
            precheck(config, shared)  # a bad config answers before torch loads
            check_algorithm_overrides(per_algorithm, names)
            from fedge.experiments.compare import Unfinished
            from fedge.experiments.compare import compare as run_comparison

            seed_list = _seed_list(seeds) or [0]
            count = seed_list[0] if len(seed_list) == 1 else None
            total = len(names) * (count if count is not None else len(seed_list))
            if not quiet:
                console.print(f"checking all {total} runs before training any", highlight=False)
            try:
                outcome = run_comparison(
                    fedge.resolve_config(config, shared),
                    names,
                    count if count is not None else len(seed_list),
                    watch=_compare_progress(total, quiet),
                    target=target,
                    seed_list=None if count is not None else seed_list,
                    algorithm_overrides=per_algorithm,
                )
            except Unfinished as stopped:  # the finished runs' table, then the error's one line
                _show_comparison(stopped.comparison, target, as_json)
                raise stopped.error from None
    _show_comparison(outcome, target, as_json)


def _compare_progress(total: int, quiet: bool) -> Callable[[str, int, Runner], AbstractContextManager[Any]]:
    """Each run of a comparison announced (``[i/N] name seed s -> dir``), then its rounds shown as
    ``fedge run`` shows them (a bar, or plain lines when piped)."""
    from fedge.cli.progress import RunProgress

    started = 0

    @contextmanager
    def watch(name: str, offset: int, runner: Runner) -> Iterator[None]:
        nonlocal started
        started += 1
        seed = runner.config.seed
        if not quiet:
            console.print(f"[{started}/{total}] {name} seed {seed} -> {runner.run_dir}", markup=False)
        label = f"{name} s{seed}"
        with RunProgress(console, runner.config.rounds, runner.start, quiet, label=label) as progress:
            runner.on_round = progress
            yield

    return watch


def _show_comparison(outcome: Any, target: float | None, as_json: bool) -> None:
    """A comparison's table (or JSON); nothing when no run finished."""
    if as_json:
        typer.echo(json.dumps({"out_dir": str(outcome.out_dir), "rows": outcome.rows}, indent=1))
    elif outcome.rows:
        _print_comparison(outcome, target)


def _mean_std(row: dict[str, Any], key: str, scale: float = 1.0) -> str:
    """``mean ± std`` over a row's seeds; the mean alone for one seed (a spread of one is no spread)."""
    mean = f"{scale * row[f'{key}_mean']:.2f}"
    return mean if row["seeds"] < 2 else f"{mean} ± {scale * row[f'{key}_std']:.2f}"


def _print_comparison(outcome: Any, target: float | None) -> None:
    seeds = max(row["seeds"] for row in outcome.rows)
    table = Table(title=f"fedge compare · up to {seeds} seed(s) · {outcome.out_dir}")
    columns = ["algorithm", "accuracy % (final)", "accuracy % (best)", "MB, all links"]
    columns += ["server MB", "client MB", "sim. s", "sim. J", "epsilon"]
    perplexity = all("final_perplexity_mean" in row for row in outcome.rows)  # language models
    columns += ["perplexity (final)"] if perplexity else []
    leaks = any("leaks_mean" in row for row in outcome.rows)  # eval.attacks
    columns += ["leaks (last recorded round)"] if leaks else []
    if target is not None:
        columns += [
            f"rounds to {100 * target:g} %",
            f"MB to {100 * target:g} %",
            f"sim. s to {100 * target:g} %",
        ]
    for column in columns:
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    for row in outcome.rows:
        cells = [
            row["algorithm"],
            _mean_std(row, "final_accuracy", 100),
            _mean_std(row, "best_accuracy", 100),
            f"{row['communication_mb']:.3f}",
            f"{row['server_storage_mb']:.3f}",
            f"{row['client_storage_mb']:.3f}",
            f"{row['sim_seconds_mean']:.2f}",
            f"{row['sim_joules_mean']:.3g}",
            "none" if row.get("epsilon_mean") is None else f"{row['epsilon_mean']:.3g}",
        ]
        cells += [f"{row['final_perplexity_mean']:.3f}"] if perplexity else []
        shown = ", ".join(f"{k.removeprefix('leak_')} {v:.3g}" for k, v in row.get("leaks_mean", {}).items())
        cells += [escape(shown)] if leaks else []
        if target is not None:
            reached = row["target_reached"]
            if reached:
                note = f" ({reached}/{row['seeds']})" if reached < row["seeds"] else ""
                cells += [
                    f"{row['rounds_to_target']:.1f}{note}",
                    f"{row['mb_to_target']:.3f}",
                    f"{row['sim_seconds_to_target']:.3g}",
                ]
            else:
                cells += ["not reached"] * 3
        table.add_row(*cells)
    console.print(table)
    for name, keys in outcome.dropped.items():
        console.print(f"note: {name} ignores algorithm keys {', '.join(keys)}")


@app.command()
def report(
    paths: Annotated[
        list[str], typer.Argument(help="run directories, sweep or compare directories, or globs of them")
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="the HTML file (default: report.html in the directory given, or the runs' folder)"),
    ] = None,
    target: Annotated[
        list[float] | None, typer.Option("--target", "-t", help="accuracy levels of the time-to-target table")
    ] = None,
) -> None:
    """Write one self-contained HTML report (figures embedded) of a run, a sweep or a comparison."""
    from fedge.report.page import write_report

    with _reported():
        written = write_report(paths, out, target)
    console.print(str(written))


ATTACK_NAMES = (
    "label_norm",
    "label_direction",
    "decoder",
    "inversion",
    "gradient_inversion",
    "tokens",
    "membership",
    "membership_calibrated",
)


@app.command()
def attack(
    run_dir: Annotated[Path, typer.Argument(help="a finished run directory")],
    names: Annotated[
        list[str] | None,
        typer.Option(
            "--attack",
            "-a",
            help=f"an attack to run (repeat it; default: all the run allows): {', '.join(ATTACK_NAMES)}",
        ),
    ] = None,
    rounds: Annotated[
        list[int] | None, typer.Option("--round", "-r", help="a recorded round to attack (default: all)")
    ] = None,
    seed: Annotated[int, typer.Option(help="the seed of every random draw of the attacks")] = 0,
) -> None:
    """Attack what a run recorded (output.record) or its final model; figures go to attacks.json.

    Each attack states its paper and threat model there, with the seconds it took on this machine.
    """
    from fedge.attacks.from_run import attack as run_attacks

    with _reported():
        found = run_attacks(run_dir, names or None, seed, rounds)
    table = Table(title=f"attacks on {run_dir}", title_justify="left")
    for column in ("attack", "figures", "seconds"):
        table.add_column(column)
    for name, figures in found.items():
        shown = {k: v for k, v in figures.items() if isinstance(v, float) and k != "seconds"}
        line = ", ".join(f"{k} {v:.3g}" for k, v in shown.items())
        table.add_row(name, escape(line), f"{figures['seconds']:.1f}")
    console.print(table)
    console.print(str(run_dir / "attacks.json"))


def _algorithm_fields(name: str, as_json: bool) -> None:
    """The keys of one algorithm's config block: type, default, other spellings and description."""
    import difflib

    from fedge.intake import catalog, plugins

    shipped = catalog.load()["algorithm_keys"]
    if name in shipped and name not in {p.name for p in plugins.discovered("algorithms")}:
        rows = shipped[name]  # a built-in algorithm: from the catalog, no torch
    else:
        from fedge.config import AlgorithmConfig, describe_fields
        from fedge.extend import load_entry_points

        with _reported():
            load_entry_points()
            known = AlgorithmConfig.registry
            if name not in known:
                near = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}"
                raise FedgeError(f"--algorithm: unknown algorithm {name!r}; {hint}")
        rows = describe_fields(known[name])
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"algorithm: {name} (keys of the algorithm block)", title_justify="left")
    for column in ("key", "type", "default", "description"):
        table.add_column(column)
    for row in rows:
        key = row["key"] + "".join(f" | {alias}" for alias in row["aliases"])
        table.add_row(
            f"[bold]{escape(key)}",
            escape(row["type"]),
            escape(json.dumps(row["default"])),
            row["description"],
        )
    console.print(table)


def _plugins() -> dict[str, dict[str, str]]:
    """Entry points of installed packages, by kind (names and targets only: nothing is imported)."""
    from fedge.intake.plugins import GROUPS, discovered

    return {kind: {point.name: point.value for point in discovered(kind)} for kind in GROUPS}


@app.command("list")
def list_components(
    as_json: AsJson = False,
    algorithm: Annotated[
        str | None, typer.Option("--algorithm", help="print this algorithm's config keys, types, defaults")
    ] = None,
) -> None:
    """Algorithms, datasets, partitioners and models (with their cut points), and installed plugins."""
    from fedge.intake.catalog import load

    if algorithm is not None:
        _algorithm_fields(algorithm, as_json)
        return
    catalog = load()
    plugins = _plugins()
    if as_json:
        typer.echo(json.dumps({**catalog, "plugins": plugins}, indent=1))
        return
    for title in ("algorithms", "datasets", "partitioners"):
        table = Table(title=title, show_header=False, title_justify="left")
        for name, description in catalog[title].items():
            table.add_row(f"[bold]{name}", description)
        console.print(table)
    table = Table(title="models (cut k = the first k blocks run on the client)", title_justify="left")
    for column in ("model", "description", "example input", "cut points (k:last client block)"):
        table.add_column(column)
    for model in catalog["models"]:
        cuts = ", ".join(f"{k}:{block}" for k, block in model["cuts"])
        table.add_row(
            f"[bold]{model['name']}", model["description"], "x".join(map(str, model["input"])), cuts or "-"
        )
    console.print(table)
    if any(plugins.values()):
        table = Table(title="from installed packages (entry points)", title_justify="left")
        for column in ("kind", "name", "provided by"):
            table.add_column(column)
        for kind, points in plugins.items():
            for name, target in points.items():
                table.add_row(kind.removesuffix("s"), f"[bold]{escape(name)}", escape(target))
        console.print(table)


@app.command()
def schema(
    out: Annotated[
        Path | None, typer.Option(help="write the schema to this file (default: print it)")
    ] = None,
) -> None:
    """The JSON Schema of a run config (every block, every algorithm), for editors that check YAML."""
    from fedge.intake import catalog, plugins

    with _reported():
        if plugins.discovered("algorithms"):  # a plugin's algorithm block: from the live registry
            from fedge.config import json_schema
            from fedge.extend import load_entry_points

            load_entry_points()
            text = json.dumps(json_schema(), indent=1) + "\n"
        else:
            text = json.dumps(catalog.load_schema(), indent=1) + "\n"
        if out is None:
            typer.echo(text, nl=False)
            return
        from fedge.files.results import write_text

        write_text(out, text)
    console.print(f"wrote {out}")


@app.command()
def plot(
    paths: Annotated[
        list[str], typer.Argument(help="run directories, sweep or compare directories, or globs of them")
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="folder for the figures (default: plots/ in the one directory given, else ./plots)"
        ),
    ] = None,
    pdf: Annotated[bool, typer.Option("--pdf", help="also write PDF (vector) figures")] = False,
) -> None:
    """Plot accuracy vs round, communicated MB and simulated time; legends name what differs between runs.

    Runs alike but for their seed are one curve: the mean over seeds, with a band of one standard deviation.
    """
    from fedge.files import results
    from fedge.report.page import find_runs, group_cells, mean_curve
    from fedge.runner.plots import plot_runs

    with _reported():
        cells = group_cells(find_runs(paths))
    runs = [(cell.label, mean_curve(cell) if len(cell.runs) > 1 else cell.runs[0].rows) for cell in cells]
    one_folder = len(paths) == 1 and Path(paths[0]).is_dir()
    target = out or (Path(paths[0]) / results.PLOTS if one_folder else Path("plots"))
    with _reported():
        try:
            written = plot_runs(runs, target, formats=("png", "pdf") if pdf else ("png",))
        except OSError as error:
            raise _fail(f"{target}: cannot write plots here ({error.strerror or error})") from None
    for path in written:
        console.print(str(path))
