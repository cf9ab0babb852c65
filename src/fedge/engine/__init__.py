"""Client engine: stacked client state and the executors that train it."""

from fedge.engine.bank import ClientBank, stack_copies, weighted_sum
from fedge.engine.evaluate import evaluate_model
from fedge.engine.executors import (
    EXECUTORS,
    BatchedExecutor,
    ClientFailed,
    Executor,
    Mapped,
    SequentialExecutor,
    make_executor,
)
from fedge.engine.noise import NoiseStreams, has_random_layers
from fedge.engine.step import (
    SGD,
    Adam,
    Criterion,
    Optimizer,
    buffers_of,
    classification_loss,
    cross_entropy,
    make_optimizer,
    make_step,
    parameters_of,
    weighted_mean,
)

__all__ = [
    "EXECUTORS",
    "SGD",
    "Adam",
    "Criterion",
    "Optimizer",
    "BatchedExecutor",
    "ClientBank",
    "ClientFailed",
    "Executor",
    "Mapped",
    "NoiseStreams",
    "SequentialExecutor",
    "buffers_of",
    "classification_loss",
    "cross_entropy",
    "evaluate_model",
    "has_random_layers",
    "make_executor",
    "make_optimizer",
    "make_step",
    "parameters_of",
    "stack_copies",
    "weighted_mean",
    "weighted_sum",
]
