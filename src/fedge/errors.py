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
    """Base class of errors the CLI reports as one line with exit code 2 (:attr:`exit_code`)."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(FedgeError):
    """A config key has an unknown name or an impossible value."""

    def __init__(self, key: str, message: str):
        self.key, self.message = key, message  # the message without the key, to re-raise with more
        super().__init__(f"{key}: {message}")


class DataError(FedgeError):
    """A dataset file is missing or malformed."""


class PathError(FedgeError):
    """A file or folder cannot be used: not writable, not a directory, in use by another run."""

    def __init__(self, path: Path | str, message: str):
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


class CheckpointError(PathError):
    """A checkpoint is empty, damaged, of another format, or belongs to another run."""


class Diverged(Exception):
    """A NaN or infinite loss, metric or parameter stopped the run (``stop.on_nonfinite: error``).

    The run directory keeps the last good checkpoint and a ``summary.json`` giving the reason.
    """

    def __init__(self, run_dir: Path, round_: int, what: str, checkpoint_round: int | None):
        self.run_dir, self.round, self.what, self.checkpoint_round = run_dir, round_, what, checkpoint_round
        kept = f"checkpoint of round {checkpoint_round} kept" if checkpoint_round else "no checkpoint yet"
        super().__init__(
            f"{run_dir}: diverged in round {round_}: {what} ({kept}; stop.on_nonfinite=continue runs on)"
        )
