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


PAPER_BUFFER = 10  # FedBuff's K in most of Nguyen et al.'s runs, far below their hundreds in flight


class FedBuffConfig(AsyncConfig):
    """FedBuff (Nguyen et al., 2022): the server aggregates every ``buffer_size`` arrived updates.

    The defaults are the paper's (its Algorithm 1 and experiments): K = 10, each update weighted 1/K, and
    scaled by 1/sqrt(1 + tau). ``weighting: samples`` with ``buffer_size`` = the clients in flight is
    FedAvg's sample-weighted average instead (with identical devices, FedAvg exactly).
    """

    name: Literal["fedbuff"] = "fedbuff"
    """the algorithm (`fedge list`)"""
    buffer_size: PositiveInt | None = None
    """updates per aggregation, K (none: the paper's 10, or the clients in flight when fewer)"""
    weighting: Literal["uniform", "samples"] = "uniform"
    """each buffered update weighs 1/K (uniform, the paper's) or its sample share in the buffer (samples)"""
    staleness: Literal["sqrt", "none"] = "sqrt"
    """an update tau versions old is scaled by 1/sqrt(1 + tau) (sqrt, the paper's) or taken as it is (none)"""


class FedAsyncConfig(AsyncConfig):
    """FedAsync (Xie et al., 2019): every arrived update is mixed into the model at once.

    The paper's forms: a client minimises its loss plus ``proximal_mu / 2 ||x - x_tau||^2`` (its
    regularised local objective, rho, pulling towards the model it received), and the server mixes with
    ``alpha s(tau)``, ``s`` constant, polynomial ``(1 + tau)^(-a)`` or hinge (1 up to ``b`` versions
    stale, then ``1 / (a (tau - b) + 1)``). Defaults: alpha 0.6 with polynomial a = 0.5 (the paper's
    FedAsync+Poly) and a small proximal pull, rho = 0.005; ``proximal_mu: 0`` is plain local SGD.
    """

    name: Literal["fedasync"] = "fedasync"
    """the algorithm (`fedge list`)"""
    mixing: Annotated[float, Field(gt=0.0, le=1.0)] = 0.6
    """alpha: the weight of a fresh update in the mix"""
    staleness: Literal["polynomial", "constant", "hinge"] = "polynomial"
    """alpha_t = alpha (1 + tau)^(-a) (polynomial), alpha (constant), or alpha s_ab(tau) (hinge)"""
    exponent: Annotated[float, Field(ge=0.0, le=10.0)] = 0.5
    """a, the polynomial staleness exponent"""
    hinge_a: Annotated[float, Field(ge=0.0, le=1e6)] = 10.0
    """a, the hinge's slope: s(tau) = 1 / (a (tau - b) + 1) past b versions"""
    hinge_b: Annotated[int, Field(ge=0, le=1_000_000)] = 4
    """b, the versions of staleness the hinge takes at full weight"""
    proximal_mu: Annotated[float, Field(ge=0.0, le=1e6)] = 0.005
    """rho: weight of the local objective's pull (rho/2 ||x - x_tau||^2) to the model the client received"""
