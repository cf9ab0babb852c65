"""The permissions of what fedge creates through temporary names: what the user's umask allows.

``tempfile.mkstemp`` and ``mkdtemp`` create files 0600 and folders 0700 whatever the umask, so a run
directory, its results and a downloaded dataset renamed from them would be private to their owner and
block sharing a report with a group. Everything fedge writes is given ``0666 & ~umask`` (files) or
``0777 & ~umask`` (folders), as ``open`` and ``mkdir`` would.
"""

from __future__ import annotations

import os
from pathlib import Path


def current() -> int:
    """The process's umask (read from /proc where it can be, without changing it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_file(fd: int) -> None:
    """Give an open file (from ``mkstemp``) the permissions ``open`` would have: ``0666 & ~umask``."""
    os.fchmod(fd, 0o666 & ~current())


def share_folder(path: Path) -> None:
    """Give a folder (from ``mkdtemp``) the permissions ``mkdir`` would have: ``0777 & ~umask``."""
    os.chmod(path, 0o777 & ~current())
