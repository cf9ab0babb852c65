"""Reading an input file only when it is a regular file, and only up to a size.

A FIFO blocks whoever opens it until a writer appears (a run would wait forever), a device such as
``/dev/zero`` never ends, and a file larger than memory is read until memory runs out. :func:`open_regular`
opens a path without waiting (``O_NONBLOCK``) and refuses anything but a regular file before a byte is
read; :func:`read_regular` also refuses a file larger than a cap, from its size on disk. Both raise
:class:`NotReadable` with the reason alone, which the caller words with its key or file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

KINDS = {  # what a path is when it is no regular file, for the refusal
    stat.S_ISDIR: "a directory",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a FIFO",
    stat.S_ISSOCK: "a socket",
}


class NotReadable(Exception):
    """A path that is not read: it cannot be opened, is no regular file, or is larger than allowed."""

    def __init__(self, reason: str, kind: str | None = None):
        self.reason, self.kind = reason, kind  # ``kind``: what the path is when it is no regular file
        super().__init__(reason, kind)

    def __str__(self) -> str:
        return self.reason


def mebibytes(size: int) -> str:
    """A size in whole MiB with thousands separators, e.g. ``'2,048 MiB'``."""
    return f"{size / 2**20:,.0f} MiB"


def open_regular(path: Path | str) -> BinaryIO:
    """``path`` opened for reading in binary, refused (:class:`NotReadable`) unless it is a regular file.

    The open never waits: a FIFO is opened without a writer and refused at once.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise NotReadable(f"cannot be read ({error.strerror or type(error).__name__})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in KINDS.items() if test(mode)), "not a file")
        raise NotReadable(f"is not a regular file ({kind})", kind)
    return os.fdopen(fd, "rb")


def read_regular(path: Path | str, cap: int, prefix: int | None = None) -> bytes:
    """The bytes of regular file ``path`` (its first ``prefix`` bytes, where given); a file of more than
    ``cap`` bytes is refused from its size, unread, unless only a prefix of at most ``cap`` is asked for."""
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        wanted = size if prefix is None else min(size, prefix)
        if wanted > cap:
            raise NotReadable(f"is {mebibytes(size)}; fedge reads at most {mebibytes(cap)} of it")
        try:
            return handle.read(wanted)
        except OSError as error:
            raise NotReadable(f"cannot be read ({error.strerror or type(error).__name__})") from None
