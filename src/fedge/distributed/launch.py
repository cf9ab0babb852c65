"""``fedge run --procs K``: the same command as K ranks on this host, through torchrun's launcher."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from fedge.distributed.lifeline import LAUNCHER_PID
from fedge.errors import EXIT_PEER_LOST

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}" + (": it lost a peer" if exitcode == EXIT_PEER_LOST else "")


def failure_line(failures: dict[int, ProcessFailure], procs: int) -> str:
    """One line naming the rank that failed first among the ranks torchrun found failed.

    Consequences come last: a rank that lost a peer (exit code :data:`~fedge.errors.EXIT_PEER_LOST`:
    its collective broke when the peer died), and before it a rank ended by SIGTERM (what torchrun sends
    the ranks it stops once one failed). Any other failure (another signal, an error of its own) comes
    first; then the earliest, then the lowest rank.
    """

    def order(item: tuple[int, ProcessFailure]) -> tuple[int, float, int]:
        rank, failure = item
        code = failure.exitcode
        tier = 2 if code == EXIT_PEER_LOST else 1 if code == -signal.SIGTERM else 0
        return tier, failure.timestamp, rank

    rank, failure = min(failures.items(), key=order)
    return f"rank {rank} of {procs} failed first ({_how(failure.exitcode)}); the other ranks were stopped"


def run_local(procs: int, argv: list[str], threads: int | None = None) -> str | None:
    """Run ``python -m fedge ARGV`` as ``procs`` ranks on this host (torchrun ``--standalone``).

    Returns ``None`` when every rank finished, else one line saying which rank failed first and how
    (each rank has printed its own error line already). ``threads`` sets ``OMP_NUM_THREADS`` of every
    rank (default: one thread per rank, torchrun's own default).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", str(threads or 1))
    os.environ[LAUNCHER_PID] = str(os.getpid())  # each rank dies with this process (lifeline.py)
    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={procs}", "--module", "fedge", *argv]
    )
    try:
        run(args)
    except ChildFailedError as error:
        return failure_line(error.failures, procs)
    return None
