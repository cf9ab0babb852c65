"""The ``fedge`` command line: run, resume, compare, list, plot.

Bad input (an unknown key, an impossible value, a missing or unwritable file, a damaged checkpoint, a run
too large for the machine's memory) prints one line ``error: <key or file>: <message>`` and exits with
code 2; no results directory is created for it. A run stopped by a NaN or infinite number prints one
line and exits with code 3.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import fedge
from fedge import results
from fedge.algorithms import ALGORITHMS
from fedge.cli_bounds import bounds
from fedge.compare import compare as run_comparison
from fedge.data.partition import PARTITIONERS
from fedge.data.sources import source_descriptions
from fedge.errors import EXIT_BAD_INPUT, EXIT_DIVERGED, Diverged, FedgeError
from fedge.models import model_cut_points, model_descriptions
from fedge.plots import plot_runs
from fedge.runner import Result, Runner, open_run, start_run

EXAMPLE_INPUTS = {"cse_cifar": (3, 24, 24), "vgg": (3, 32, 32), "resnet18": (3, 32, 32), "cnn4": (3, 32, 32)}

app = typer.Typer(add_completion=False, no_args_is_help=False, help=fedge.__doc__)
console = Console()
errors = Console(stderr=True)
app.command("bounds")(bounds)


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
        raise _fail(str(error)) from None
    except Diverged as error:
        raise _fail(str(error), EXIT_DIVERGED) from None
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise _fail(f"memory: the run ran out of memory ({first})") from None


def _run_with_progress(runner: Runner, quiet: bool) -> Result:
    """Run the remaining rounds under a progress bar that shows the latest accuracy."""
    with Progress(
        TextColumn("[bold]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    ) as progress:
        task = progress.add_task("rounds", total=runner.config.rounds, completed=runner.start, status="")

        def on_round(t: int, row: dict[str, Any] | None) -> None:
            status = f"acc {100 * row['accuracy']:.2f}%  {row['mb_total']:.2f} MB" if row else None
            progress.update(task, completed=t, **({"status": status} if status else {}))

        runner.on_round = on_round
        return runner.run()


def _print_summary(result: Result) -> None:
    s = result.summary
    table = Table(title=f"fedge · {s['algorithm']} on {s['dataset']}", show_header=False)
    table.add_row("final accuracy", f"{100 * s['final_accuracy']:.2f} % (round {s['rounds']})")
    table.add_row("best accuracy", f"{100 * s['best_accuracy']:.2f} % (round {s['best_round']})")
    table.add_row("communication up", f"{s['mb_up']:.3f} MB")
    table.add_row("communication down", f"{s['mb_down']:.3f} MB")
    table.add_row("simulated time", f"{s['sim_seconds']:.2f} s, {s['sim_joules']:.3g} J (wireless model)")
    table.add_row("wall time", f"{s['wall_seconds']:.1f} s")
    table.add_row("results", str(result.run_dir))
    console.print(table)


def _split_config_argument(config: str | None, overrides: list[str] | None) -> tuple[str | None, list[str]]:
    """A first argument that looks like ``key=value`` (and is no file) is an override, not a config."""
    overrides = list(overrides or [])
    if config is not None and "=" in config and not Path(config).exists():
        return None, [config, *overrides]
    return config, overrides


@app.command()
def run(
    config: Annotated[str | None, typer.Argument(help="YAML config (omit for the digits quickstart)")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. rounds=50")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
) -> None:
    """Run a config (or the built-in quickstart) and write its results directory."""
    config, overrides = _split_config_argument(config, overrides)
    with _reported():
        result = _run_with_progress(start_run(fedge.resolve_config(config, overrides), force=force), quiet)
    _print_summary(result)


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="a run directory with config.yaml and checkpoint.pt")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
) -> None:
    """Continue an interrupted run from its last checkpoint to the identical result."""
    with _reported():
        result = _run_with_progress(open_run(run_dir, force=force), quiet)
    _print_summary(result)


@app.command()
def compare(
    config: Annotated[str | None, typer.Argument(help="YAML config shared by every algorithm")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted overrides, e.g. rounds=50")] = None,
    algorithms: Annotated[str, typer.Option("--algorithms", "-a", help="comma-separated names")] = "fedavg",
    seeds: Annotated[int, typer.Option("--seeds", "-s", help="seeds per algorithm")] = 1,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Run several algorithms on one config (over seeds) and print a comparison table."""
    config, overrides = _split_config_argument(config, overrides)
    names = [name.strip() for name in algorithms.split(",") if name.strip()]

    def announce(name: str, offset: int, runner: Runner) -> None:
        if not quiet:
            console.print(f"[bold]{name}[/] seed {runner.config.seed} -> {runner.run_dir}")

    with _reported():
        outcome = run_comparison(fedge.resolve_config(config, overrides), names, seeds, on_run=announce)
    table = Table(title=f"fedge compare · {seeds} seed(s) · {outcome.out_dir}")
    columns = (
        "algorithm",
        "accuracy % (final)",
        "accuracy % (best)",
        "comm. GiB",
        "server M",
        "client M",
        "sim. s",
        "sim. J",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for row in outcome.rows:
        table.add_row(
            row["algorithm"],
            f"{100 * row['final_accuracy_mean']:.2f} ± {100 * row['final_accuracy_std']:.2f}",
            f"{100 * row['best_accuracy_mean']:.2f} ± {100 * row['best_accuracy_std']:.2f}",
            f"{row['communication_gib']:.4f}",
            f"{row['server_storage_mparams']:.4f}",
            f"{row['client_storage_mparams']:.4f}",
            f"{row['sim_seconds_mean']:.2f}",
            f"{row['sim_joules_mean']:.3g}",
        )
    console.print(table)
    for name, keys in outcome.dropped.items():
        console.print(f"note: {name} ignores algorithm keys {', '.join(keys)}")


@app.command("list")
def list_components() -> None:
    """Algorithms, datasets, partitioners and models (with their cut points)."""
    sections: list[tuple[str, dict[str, str]]] = [
        ("algorithms", {name: cls.description for name, cls in sorted(ALGORITHMS.items())}),
        ("datasets", source_descriptions()),
        ("partitioners", dict(PARTITIONERS)),
    ]
    for title, entries in sections:
        table = Table(title=title, show_header=False, title_justify="left")
        for name, description in entries.items():
            table.add_row(f"[bold]{name}", description)
        console.print(table)
    table = Table(title="models (cut k = the first k blocks run on the client)", title_justify="left")
    for column in ("model", "description", "example input", "cut points (k:last client block)"):
        table.add_column(column)
    for name, description in model_descriptions().items():
        shape = EXAMPLE_INPUTS.get(name, (1, 28, 28))
        cuts = ", ".join(f"{k}:{block}" for k, block in model_cut_points(name, shape, 10))
        table.add_row(f"[bold]{name}", description, "x".join(map(str, shape)), cuts or "-")
    console.print(table)


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="one or more run directories")],
    out: Annotated[Path | None, typer.Option(help="folder for the PNGs (default: the run's plots/)")] = None,
) -> None:
    """Plot accuracy vs round and vs communicated MB for one or more runs."""
    runs = []
    for run_dir in run_dirs:
        metrics = run_dir / results.METRICS
        if not metrics.is_file():
            raise _fail(f"{metrics}: no metrics in this run directory")
        with _reported():
            runs.append((run_dir.name, results.read_jsonl(metrics)))
    target = out or (run_dirs[0] / results.PLOTS if len(run_dirs) == 1 else Path("plots"))
    with _reported():
        try:
            written = plot_runs(runs, target)
        except OSError as error:
            raise _fail(f"{target}: cannot write plots here ({error.strerror or error})") from None
    for path in written:
        console.print(str(path))
