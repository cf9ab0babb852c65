"""Child processes a test starts, never waited on or read from without a bound.

A test that starts a process must not hang the suite when the child does: every wait has a timeout,
pipes are read by a thread (a read never blocks the test past its bound), and a child that overstays
is killed with everything it started (its own process group), then reaped, before the test fails with
the child's last output.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any, NoReturn

REAP = 30.0  # seconds a killed child (and its pipes) may take to be gone
TAIL = 2000  # characters of a child's output an assertion message quotes


def stop(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and its process group (what it started), reap it and close its pipes, all bounded."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=REAP)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@contextlib.contextmanager
def started(command: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """``command`` running in its own process group; it (and what it started) is killed when the block
    ends, whether the test passed or not."""
    proc = subprocess.Popen(command, start_new_session=True, **popen)
    try:
        yield proc
    finally:
        stop(proc)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``proc``'s standard output and error once it exits within ``timeout`` seconds; otherwise it is
    killed and the test fails, quoting what it wrote."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(proc, f"still running after {timeout:g} s")
    return out or "", err or ""


def fail(proc: subprocess.Popen, why: str) -> NoReturn:
    """Kill ``proc`` and fail the test with ``why`` and the tail of its standard error (read bounded)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    try:
        _, err = proc.communicate(timeout=REAP)
    except (subprocess.TimeoutExpired, ValueError):  # a pipe still held open, or already read
        err = None
    stop(proc)
    tail = (err or "")[-TAIL:] if isinstance(err, str) else ""
    raise AssertionError(f"{' '.join(map(str, proc.args))}: {why}; killed. stderr: {tail}")


class Lines:
    """The lines of a child's pipe, read by a thread, so that waiting for one has a bound."""

    def __init__(self, pipe: IO[str]):
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe: IO[str]) -> None:
        with contextlib.suppress(ValueError, OSError):  # the pipe closed under the reader: the end
            for line in pipe:
                self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> str:
        """The next line ("" at the end of the output); AssertionError after ``timeout`` seconds."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout:g} s") from None
        return "" if line is None else line

    def rest(self, timeout: float) -> str:
        """Everything up to the end of the output, which must come within ``timeout`` seconds."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"the output did not end within {timeout:g} s")
        parts = []
        with contextlib.suppress(queue.Empty):
            while (line := self.lines.get_nowait()) is not None:
                parts.append(line)
        return "".join(parts)


def reap(pid: int, timeout: float = REAP) -> None:
    """Wait for the forked child ``pid`` to end (SIGKILLed after ``timeout`` seconds), never unbounded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):  # reaped already
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                time.sleep(0.01)
                continue
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # a SIGKILLed child ends at once
