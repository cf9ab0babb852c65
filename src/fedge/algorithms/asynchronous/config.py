"""The knobs the straggler-aware and asynchronous FedAvg variants share, and each one's own."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt

from fedge.config import AlgorithmConfig, Fraction, SGDConfig


class LocalWorkConfig(AlgorithmConfig):
    """What a client does with the model it receives: FedAvg's local training, and the links' codecs."""

    fraction: Fraction = 1.0
    """share of clients working at once: a round's cohort, or the clients in flight (at least one)"""
    local_epochs: PositiveInt = 1
    """passes over the client's data per job"""
    batch_size: PositiveInt = 32
    """samples per local step"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    """the clients' local optimizer (fresh for every job)"""
    codec_up: Literal["fp32", "fp16"] = "fp32"
    """encoding of the uploaded models"""
    codec_down: Literal["fp32", "fp16"] = "fp32"
    """encoding of the models sent to clients"""


class DeadlineConfig(LocalWorkConfig):
    """Synchronous FedAvg that knows about stragglers (docs/async.md)."""

    name: Literal["fedavg_deadline"] = "fedavg_deadline"
    """the algorithm (`fedge list`)"""
    deadline_s: Annotated[float, Field(gt=0.0, le=1e9)] | None = None
    """simulated seconds the server waits for a round's uploads (none: for every selected client)"""
    late: Literal["drop", "partial"] = "drop"
    """a client that misses the deadline is dropped, or sends the steps it finished in time (partial)"""
    over_select: Annotated[float, Field(ge=0.0, le=10.0)] = 0.0
    """select this share more clients than the cohort; the first arrivals up to the cohort are kept"""
    sampling: Literal["available", "uniform"] = "available"
    """sample among the clients online this round, or among all (offline ones then miss the round)"""


class AsyncConfig(LocalWorkConfig):
    """The asynchronous server's shared knobs."""

    server_lr: Annotated[float, Field(gt=0.0, le=100.0)] = 1.0
    """the server's step on the aggregated update (FedBuff's eta_g)"""


class FedBuffConfig(AsyncConfig):
    """FedBuff (Nguyen et al., 2022): the server aggregates every ``buffer_size`` arrived updates."""

    name: Literal["fedbuff"] = "fedbuff"
    """the algorithm (`fedge list`)"""
    buffer_size: PositiveInt | None = None
    """updates per aggregation, K (none: the clients in flight, so K = cohort)"""
    staleness: Literal["sqrt", "none"] = "sqrt"
    """an update tau versions old is scaled by 1/sqrt(1 + tau) (sqrt) or taken as it is (none)"""


class FedAsyncConfig(AsyncConfig):
    """FedAsync (Xie et al., 2019): every arrived update is mixed into the model at once."""

    name: Literal["fedasync"] = "fedasync"
    """the algorithm (`fedge list`)"""
    mixing: Annotated[float, Field(gt=0.0, le=1.0)] = 0.6
    """alpha: the weight of a fresh update in the mix"""
    staleness: Literal["polynomial", "constant"] = "polynomial"
    """alpha_t = alpha (1 + tau)^(-a) (polynomial) or alpha (constant)"""
    exponent: Annotated[float, Field(ge=0.0, le=10.0)] = 0.5
    """a, the polynomial staleness exponent"""
