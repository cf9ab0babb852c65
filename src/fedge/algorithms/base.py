"""The one interface every algorithm implements and the algorithm registry (the context an algorithm is
built from is :class:`fedge.runtime.Context`, re-exported here)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import torch

from fedge.config import AlgorithmConfig, RunConfig, register_algorithm_config
from fedge.distributed.evaluate import evaluate_model_on
from fedge.metrics import Evaluation, RoundReport
from fedge.models.transformer import LANGUAGE_MODELS
from fedge.runtime import Context
from fedge.tensors import Tensors, on_device

__all__ = ["ALGORITHMS", "Algorithm", "Context", "GlobalModel", "executor_name", "register"]

ConfigT = TypeVar("ConfigT", bound=AlgorithmConfig)
"""An algorithm's own config class: ``Algorithm[FedAvgConfig]`` types ``self.cfg`` as a ``FedAvgConfig``."""
AlgorithmT = TypeVar("AlgorithmT", bound="Algorithm[Any]")


class Algorithm(ABC, Generic[ConfigT]):
    """A federated algorithm: one global round at a time, evaluation, and resumable state.

    ``run_round(t)`` runs global round ``t`` (1-based), sends every transfer through a link of
    ``ctx.network`` (so the ledger sees it) and advances ``ctx.system.clock`` by the round's simulated
    latency and energy, composed as its paper says; it returns a :class:`RoundReport`. ``evaluate()``
    returns an :class:`Evaluation` of the current model(s). The state a resumed run needs is the
    attributes named in ``state_fields`` (tensors, numbers, arrays and dicts of them); algorithms with
    state in components extend :meth:`state_dict` / :meth:`load_state_dict`. Seeding is not an
    algorithm's job: the runner opens the round's random streams (:meth:`Context.start`). The class is
    generic over its config class, so ``self.cfg`` has the fields of the algorithm's own config.
    """

    name: ClassVar[str]
    config_class: ClassVar[type[AlgorithmConfig]]
    description: ClassVar[str]
    state_fields: tuple[str, ...] = ()  # an instance may name more (a configured option's state)
    takes_loss: ClassVar[bool] = True  # trains with ctx.criterion (False: its own cross-entropy terms)
    recorded: ClassVar[frozenset[str]] = frozenset()
    """The transfers ``output.record`` can keep of this algorithm (:mod:`fedge.runtime.recording`)."""
    batched_from: ClassVar[int] = 1
    """On a CPU, the clients one step must train together for ``engine.executor: auto`` to pick the
    batched executor (below: the sequential one); measured per family (docs/performance.md)."""
    lm_batched_from: ClassVar[float | None] = None
    """The same for a transformer language model (``model.name`` gpt2 or llama); None: :attr:`batched_from`
    (measured in docs/llm.md)."""

    @classmethod
    def clients_per_step(cls, config: RunConfig) -> int:
        """How many clients one training step of ``config`` trains together: the round's participants."""
        per_round = getattr(config.algorithm, "clients_per_round", None)
        sampled = getattr(config.algorithm, "participation", "full") != "full"
        return per_round if sampled and per_round else config.partition.num_clients

    def __init__(self, ctx: Context, cfg: ConfigT):
        self.ctx = ctx
        self.cfg: ConfigT = cfg

    def reads_run_length(self) -> str | None:
        """Why rounds 1..t of this run depend on its total ``config.rounds`` (a schedule over the run),
        or ``None`` when they do not, so the run may be continued past its length with the numbers a
        longer run gives (:mod:`fedge.runner.run_length`). An algorithm says ``None`` only when it knows: the
        built-in families do where it is true; an extension's algorithm overrides this to opt in."""
        return f"{self.name} does not say that its rounds ignore the run's length (reads_run_length)"

    @abstractmethod
    def run_round(self, t: int) -> RoundReport:
        """Run global round ``t``; report its training loss and figures."""

    @abstractmethod
    def evaluate(self) -> Evaluation:
        """Accuracy, loss and figures of the current model(s) on held-out data."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: the attributes named in ``state_fields``."""
        return {name: _saved(getattr(self, name)) for name in self.state_fields}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, tensors moved to the run's device."""
        for name in self.state_fields:
            value = on_device(state[name], self.ctx.device)
            current = getattr(self, name, None)
            if current is not None and hasattr(current, "load_state_dict"):
                current.load_state_dict(value)
            else:
                setattr(self, name, value)


def _saved(value: Any) -> Any:
    """What a checkpoint keeps of a state attribute: a component's own state dict, or the value."""
    return value.state_dict() if hasattr(value, "state_dict") else value


ALGORITHMS: dict[str, type[Algorithm[Any]]] = {}


def register(
    name: str, config_class: type[AlgorithmConfig], description: str
) -> Callable[[type[AlgorithmT]], type[AlgorithmT]]:
    """Class decorator: register an algorithm with its own config class under ``name``."""

    def wrap(cls: type[AlgorithmT]) -> type[AlgorithmT]:
        cls.name = name
        cls.config_class = config_class
        cls.description = description
        register_algorithm_config(name)(config_class)
        ALGORITHMS[name] = cls
        return cls

    return wrap


def executor_name(config: RunConfig, device_type: str) -> str:
    """The executor a run uses: ``engine.executor``, or for ``auto`` the faster one for this config -
    batched on a GPU, and on a CPU batched from the algorithm's :attr:`Algorithm.batched_from` clients
    trained together by a step (:attr:`Algorithm.lm_batched_from` for a language model)."""
    name = config.engine.executor
    if name != "auto":
        return name
    if device_type != "cpu" or config.engine.compile:
        return "batched"
    algorithm = ALGORITHMS[config.algorithm.name]
    threshold: float = algorithm.batched_from
    if config.model.name in LANGUAGE_MODELS and algorithm.lm_batched_from is not None:
        threshold = algorithm.lm_batched_from
    return "batched" if algorithm.clients_per_step(config) >= threshold else "sequential"


class GlobalModel(Algorithm[ConfigT]):
    """An algorithm with one global model, ``model`` run with ``params`` and ``buffers`` (FedAvg and its
    straggler-aware and asynchronous variants), evaluated on the held-out data across the run's ranks."""

    model: torch.nn.Module
    params: Tensors
    buffers: Tensors

    def reads_run_length(self) -> str | None:
        return None  # no round reads config.rounds

    def evaluate(self) -> Evaluation:
        data = self.ctx.data
        return evaluate_model_on(
            self.ctx.cohorts,
            self.model,
            self.params,
            self.buffers,
            data.x_test,
            data.y_test,
            self.ctx.config.eval.batch_size,
        )
