"""Errors that reach people: each carries one line that names the offending key or file."""


class FedgeError(Exception):
    """Base class of errors the CLI reports as one line with exit code 2."""


class ConfigError(FedgeError):
    """A config key has an unknown name or an impossible value."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class DataError(FedgeError):
    """A dataset file is missing or malformed."""
