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


def die_with_parent() -> bool:
    """Have this process killed (SIGKILL) when its parent process ends; ``False`` where the system offers
    no such request (outside Linux). Exits at once if the launcher is already gone."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is not None and launcher.isdigit() and os.getppid() != int(launcher):
        os._exit(1)  # the launcher died before the request: nobody is left to stop this rank
    return True
