"""fedge: resource-efficient federated learning at the wireless edge, with exact cost accounting."""

from __future__ import annotations

import importlib
from typing import Any

from fedge.errors import ConfigError, DataError, FedgeError

__version__ = "0.1.0"
# Imported on first use, so that `import fedge` (and the CLI's --help, list, --version) need no torch.
_LAZY = {
    "Result": "fedge.runner.loop",
    "RunConfig": "fedge.api",
    "load_config": "fedge.api",
    "register_algorithm": "fedge.extend",
    "register_dataset": "fedge.extend",
    "register_model": "fedge.extend",
    "register_stage": "fedge.extend",
    "resolve_config": "fedge.api",
    "resume": "fedge.api",
    "run": "fedge.api",
}
__all__ = [
    "ConfigError",
    "DataError",
    "FedgeError",
    "Result",
    "RunConfig",
    "costs",
    "load_config",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "register_stage",
    "resolve_config",
    "resume",
    "run",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        try:
            value = importlib.import_module(f"fedge.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"fedge.{name}":
                raise
            raise AttributeError(f"module 'fedge' has no attribute {name!r}") from None
    globals()[name] = value
    return value
