"""The one interface every algorithm implements, its build context and the algorithm registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fedge.comm import Ledger
from fedge.config import AlgorithmConfig, RunConfig, register_algorithm_config
from fedge.data.federated import FederatedData
from fedge.engine import Executor
from fedge.models import SplitModel
from fedge.system import SystemModel


@dataclass
class Context:
    """What an algorithm is built from: data, a model factory, the engine, the ledger, the wireless
    system (with its simulated clock), the device and the seed."""

    config: RunConfig
    data: FederatedData
    build_model: Callable[[], SplitModel]
    executor: Executor
    ledger: Ledger
    system: SystemModel
    device: torch.device
    seed: int


class Algorithm(ABC):
    """A federated algorithm: one global round at a time, evaluation, and resumable state.

    ``run_round(t)`` runs global round ``t`` (1-based), reports every transfer to the ledger and
    advances ``ctx.system.clock`` by the round's simulated latency and energy, composed as its paper says;
    ``evaluate()`` returns metrics of the current model(s); ``state_dict()`` / ``load_state_dict()``
    capture everything a resumed run needs to continue to the identical result.
    """

    name: ClassVar[str]
    config_class: ClassVar[type[AlgorithmConfig]]
    description: ClassVar[str]

    def __init__(self, ctx: Context, cfg: AlgorithmConfig):
        self.ctx = ctx
        self.cfg = cfg

    @abstractmethod
    def run_round(self, t: int) -> dict[str, float]:
        """Run global round ``t``; return round metrics (e.g. mean training loss)."""

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Metrics of the current model(s) on held-out data."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""


ALGORITHMS: dict[str, type[Algorithm]] = {}


def register(name: str, config_class: type[AlgorithmConfig], description: str):
    """Class decorator: register an algorithm with its own config class under ``name``."""

    def wrap(cls: type[Algorithm]) -> type[Algorithm]:
        cls.name = name
        cls.config_class = config_class
        cls.description = description
        register_algorithm_config(name)(config_class)
        ALGORITHMS[name] = cls
        return cls

    return wrap
