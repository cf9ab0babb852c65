"""Rank processes die with their launcher: no orphan rank keeps a run's files or a core after it.

A launcher killed outright (SIGKILL, or the out-of-memory killer) cannot stop its ranks, so each rank
asks the kernel to kill it when its parent dies (Linux's ``prctl(PR_SET_PDEATHSIG)``). A parent that died
before the request is caught by comparing the parent's pid with the launcher's, which ``fedge run
--procs`` passes in :data:`LAUNCHER_PID`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
LAUNCHER_PID = "FEDGE_LAUNCHER_PID"


def die_with_parent(parent: int | None = None) -> None:
    """Have this process killed (SIGKILL) when its parent process ends (Linux), and exit at once if the
    parent is already gone: its pid is no longer ``parent`` (default: the launcher's, when
    :data:`LAUNCHER_PID` names one)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent is None and os.environ.get(LAUNCHER_PID, "").isdigit():
        parent = int(os.environ[LAUNCHER_PID])
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # the parent died before the request: nobody is left to stop this process
