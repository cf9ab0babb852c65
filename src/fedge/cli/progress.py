"""Progress of long work, readable on a terminal and in a log file alike.

On a terminal a run shows a live bar; when its output goes to a file or a pipe it prints plain lines
instead, one every ``interval`` seconds and one at the end, each with the round, the latest accuracy
and the MB so far (after a ``label`` naming the run, where a command runs several). Both are
``on_round(t, row)`` hooks, the same callback ``fedge.run`` takes.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.markup import escape

PLAIN_INTERVAL = 10.0  # seconds between plain progress lines


def format_eta(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class RunProgress:
    """A run's progress: a bar on a terminal, plain lines otherwise (``quiet`` shows nothing)."""

    def __init__(
        self,
        console: Console,
        total: int,
        start: int = 0,
        quiet: bool = False,
        interval: float | None = None,
        label: str = "",
    ):
        self.console, self.total, self.quiet = console, total, quiet
        self.prefix = f"{label}  " if label else ""  # which run, where several run one after another
        self.interval = PLAIN_INTERVAL if interval is None else interval
        self.accuracy: float | None = None
        self.bar = None
        self.last_line = float("-inf")
        if not quiet and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(f"[bold]{escape(self.prefix)}round"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=console,
            )
            self.task = self.bar.add_task("rounds", total=total, completed=start, status="")

    def __enter__(self) -> RunProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def status(self, row: dict[str, Any]) -> str:
        if "accuracy" in row:
            self.accuracy = row["accuracy"]
        accuracy = "-" if self.accuracy is None else f"{100 * self.accuracy:.2f} %"
        return f"acc {accuracy}  {row['mb_total']:.2f} MB  sim {row['sim_seconds']:.3g} s"

    def __call__(self, t: int, row: dict[str, Any]) -> None:
        status = self.status(row)
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=t, status=status)
            return
        now = time.monotonic()
        if now - self.last_line >= self.interval or t == self.total:
            self.last_line = now
            self.console.print(
                f"{self.prefix}round {t}/{self.total}  {status}  wall {row['wall_seconds']:.1f} s",
                highlight=False,
                markup=False,
            )
