"""Errors that reach people: each carries one line that names the offending key or file.

The command line reports a :class:`FedgeError` as ``error: <key or file>: <message>`` with exit code
:data:`EXIT_BAD_INPUT` (a rank that lost a peer with :data:`EXIT_PEER_LOST`), and a :class:`Diverged`
run with :data:`EXIT_DIVERGED`.
"""

from __future__ import annotations

from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_PEER_LOST = 4  # a rank of a distributed run whose peer died or stopped answering


class FedgeError(Exception):
    """Base class of errors the CLI reports as one line with exit code 2 (:attr:`exit_code`).

    An error whose constructor takes more than the message passes its arguments on to
    ``Exception.__init__`` and words its line in ``__str__``: an exception is pickled as its class
    and ``args``, and a sweep's worker process hands its error to the parent that way; with the line
    alone in ``args`` the parent could not rebuild it and would report a broken process pool instead.
    """

    exit_code = EXIT_BAD_INPUT


class ConfigError(FedgeError):
    """A config key has an unknown name or an impossible value."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message  # the message without the key, to re-raise with more
        super().__init__(key, message)

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class DataError(FedgeError):
    """A dataset file is missing or malformed."""


class PathError(FedgeError):
    """A file or folder cannot be used: not writable, not a directory, in use by another run."""

    def __init__(self, path: Path | str, message: str):
        self.path, self.message = Path(path), message
        super().__init__(path, message)

    def __str__(self) -> str:
        return f"{self.args[0]}: {self.message}"


class CheckpointError(PathError):
    """A checkpoint is empty, damaged, of another format, or belongs to another run."""


class Diverged(Exception):
    """A NaN or infinite loss, metric or parameter stopped the run (``stop.on_nonfinite: error``).

    The run directory keeps the last good checkpoint and a ``summary.json`` giving the reason.
    """

    def __init__(self, run_dir: Path, round_: int, what: str, checkpoint_round: int | None):
        self.run_dir, self.round, self.what, self.checkpoint_round = run_dir, round_, what, checkpoint_round
        super().__init__(run_dir, round_, what, checkpoint_round)  # picklable, as FedgeError explains

    def __str__(self) -> str:
        saved = self.checkpoint_round
        kept = f"checkpoint of round {saved} kept" if saved else "no checkpoint yet"
        return (
            f"{self.run_dir}: diverged in round {self.round}: {self.what} "
            f"({kept}; stop.on_nonfinite=continue runs on)"
        )
