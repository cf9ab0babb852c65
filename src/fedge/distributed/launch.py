"""``fedge run --procs K``: the same command as K ranks on this host, through torchrun's launcher."""

from __future__ import annotations

import os


def run_local(procs: int, argv: list[str], threads: int | None = None) -> str | None:
    """Run ``python -m fedge ARGV`` as ``procs`` ranks on this host (torchrun ``--standalone``).

    Returns ``None`` when every rank finished, else one line saying which rank failed how (each rank
    has printed its own error line already). ``threads`` sets ``OMP_NUM_THREADS`` of every rank (default:
    one thread per rank, torchrun's own default).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", str(threads or 1))
    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={procs}", "--module", "fedge", *argv]
    )
    try:
        run(args)
    except ChildFailedError as error:
        failures = sorted(error.failures.items())
        rank, failure = failures[0]
        return f"rank {rank} of {procs} failed (exit code {failure.exitcode}); the other ranks were stopped"
    return None
