"""fedge: resource-efficient federated learning at the wireless edge, with exact cost accounting."""

from fedge import (
    algorithms,  # noqa: F401  (registers the algorithms and their configs)
    costs,
)
from fedge.api import resolve_config, resume, run
from fedge.config import RunConfig, load_config
from fedge.errors import ConfigError, DataError, FedgeError
from fedge.runner import Result

__version__ = "0.1.0"
__all__ = [
    "ConfigError",
    "DataError",
    "FedgeError",
    "Result",
    "RunConfig",
    "costs",
    "load_config",
    "resolve_config",
    "resume",
    "run",
]
