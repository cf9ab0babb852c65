"""What fedge creates through temporary names: written whole, then renamed into place, with the
permissions the user's umask allows.

A file is written under a hidden temporary name in its own folder and renamed over its final name only
once complete (:func:`staged_file`), so a reader never sees half a file and an interruption leaves the
old one, or none.

``tempfile.mkstemp`` and ``mkdtemp`` create files 0600 and folders 0700 whatever the umask, so a run
directory, its results and a downloaded dataset renamed from them would be private to their owner and
block sharing a report with a group. Everything fedge writes is given ``0666 & ~umask`` (files) or
``0777 & ~umask`` (folders), as ``open`` and ``mkdir`` would.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


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


@contextmanager
def staged_file(path: Path, mode: str = "wb", suffix: str = ".tmp", sync: bool = False) -> Iterator[IO[Any]]:
    """An open temporary file beside ``path`` (``.<name>.<random><suffix>``), renamed to ``path`` when the
    block ends normally and removed when it raises. ``sync`` flushes it to disk before the rename.
    Creating the temporary file raises ``OSError`` before the block runs."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            share_file(handle.fileno())
            yield handle
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
