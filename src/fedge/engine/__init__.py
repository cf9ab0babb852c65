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
from fedge.engine.step import SGD, buffers_of, classification_loss, make_step, parameters_of

__all__ = [
    "EXECUTORS",
    "SGD",
    "BatchedExecutor",
    "ClientBank",
    "ClientFailed",
    "Executor",
    "Mapped",
    "NoiseStreams",
    "SequentialExecutor",
    "buffers_of",
    "classification_loss",
    "evaluate_model",
    "has_random_layers",
    "make_executor",
    "make_step",
    "parameters_of",
    "stack_copies",
    "weighted_sum",
]
