"""The decentralized family's configuration: the FedAvg-FT backbone and AFIND+'s neighbour selection.

Defaults follow the AFIND+ paper where it gives a value; the others are ours (docs/decisions.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationInfo, field_validator

from fedge.algorithms.decentralized.topology import TopologyConfig
from fedge.config import AlgorithmConfig, CodecName, SGDConfig, StrictModel, aliased


def paper_optimizer() -> SGDConfig:
    """SGD with lr 0.01 and momentum 0.9, the AFIND+ paper's optimiser (App. C.3)."""
    return SGDConfig(lr=0.01, momentum=0.9)


class PeerConfig(AlgorithmConfig):
    """Knobs of the FedAvg-FT backbone shared by the whole decentralized family.

    Defaults follow the AFIND+ paper (5 local epochs, SGD lr 0.01 momentum 0.9, 10 peers per round,
    1 fine-tune epoch before evaluation); ``batch_size`` 32 is ours (the paper uses 128 on CIFAR).
    ``codec_model`` encodes the trained models peers receive, ``codec_request`` the models requesters
    send for probing, ``codec_proxy`` proxies and losses (names as ``fedge.config.CodecName``).
    ``local_update="alternating"`` trains the head alone for ``head_epochs`` epochs, then the body for
    the remaining ``local_epochs - head_epochs`` (Algorithm 1's local update, lines 17-23; default: joint
    over all parameters for ``local_epochs``, docs/decisions.md, "Joint or alternating local update").
    """

    local_epochs: PositiveInt = 5
    """passes over the client's data per round"""
    batch_size: PositiveInt = 32
    """samples per local step"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=paper_optimizer)
    """the clients' local optimizer"""
    ft_epochs: NonNegativeInt = 1
    """fine-tuning epochs of each client's copy before it is evaluated"""
    peers: PositiveInt = 10
    """neighbours each client talks to per round"""
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    """the graph of who may talk to whom"""
    personal: Literal["none", "head"] = "none"
    """none, or head: the last block stays private to each client"""
    local_update: Literal["joint", "alternating"] = "joint"
    """joint (all parameters) or alternating (head, then body)"""
    head_epochs: PositiveInt = 1
    """alternating: epochs on the head before the body"""
    probe_size: Annotated[int, Field(ge=1)] | None = None
    """samples of the batch a client probes neighbours on (default: the batch size)"""
    codec_model: CodecName = "fp32"
    """encoding of the models peers send each other"""
    codec_request: CodecName = "fp32"
    """encoding of the models requesters send for probing"""
    codec_proxy: CodecName = "fp32"
    """encoding of gradient proxies and losses"""


Positive = Annotated[float, Field(gt=0.0)]


class DPConfig(StrictModel):
    """Gaussian mechanism of Table 4: clip each example's contribution to ``clip``, add
    ``N(0, sigma^2 clip^2)``, divide by the batch size. ``target``: the proxies (our reading of the noised
    "delta", which the paper never defines) or the model update a neighbour sends (the alternative
    reading)."""

    sigma: Annotated[float, Field(ge=0.0)] = 1.0
    """noise multiplier"""
    clip: Positive = 1.0
    """per-example clipping norm"""
    target: Literal["proxy", "update"] = "proxy"
    """noise on the shared proxies or on the model updates sent"""


class SelectorConfig(StrictModel):
    """AFIND+ knobs; where the paper gives no value the default is ours (docs/decisions.md, "AFIND+")."""

    selection: Literal["threshold", "topk", "random"] = "threshold"
    """threshold (AFIND+), topk or random: how the coreset is chosen (Table 2)"""
    aggregation: Literal["boltzmann", "uniform"] = "boltzmann"
    """boltzmann weights from smoothed losses (Eq. 16) or uniform"""
    tau: Positive = 0.5
    """scale of the adaptive threshold (Eqs. 10-13)"""
    upsilon: Positive = 0.1
    """temperature of the similarity scores (Eqs. 8-9)"""
    gamma: Annotated[float, Field(ge=0.0, le=1.0)] = aliased(0.9, "loss_smoothing", "gamma")
    """smoothing of the reported losses (Eq. 15)"""
    t_agg: Positive = aliased(1.0, "aggregation_temperature", "t_agg")
    """temperature of the Boltzmann mixing weights (Eq. 16)"""
    k0: PositiveInt = aliased(10, "first_coreset_size", "k0")
    """coreset size of the cold start, while scores are uniform"""
    k_min: PositiveInt = aliased(1, "min_coreset_size", "k_min")
    """fallback coreset size when nobody passes the threshold"""
    include_self: bool = True
    """the client's own model enters its average"""
    p_update: Literal["full", "partial"] = "full"
    """full (Eq. 8, all neighbours each round) or partial (Eq. 9)"""
    explore: NonNegativeInt = 10
    """partial: random neighbours probed beyond the last coreset"""
    entropy_set: Literal["coreset", "all"] = "coreset"
    """the threshold's entropy over the coreset or all neighbours"""
    entropy_reduce: Literal["sum", "mean"] = "sum"
    """the threshold's entropy summed or averaged"""
    normalize: Literal["sigmoid", "zscore"] = "sigmoid"
    """scores normalised by a sigmoid or a z-score"""
    confidence_direction: Literal["literal", "inverted"] = "literal"
    """Eqs. 12-13's direction as printed (literal) or inverted"""
    proxy: Literal["gradient", "activation"] = "gradient"
    """what clients compare: a layer's gradient or the mean featurizer activation"""
    proxy_layer: str | None = None
    """the proxy's layer (default: the one before the head)"""
    dp: DPConfig | None = None
    """differential privacy: the Gaussian mechanism of Table 4 (off by default)"""

    @field_validator("k_min")
    @classmethod
    def _k_min_within_k0(cls, value: int, info: ValidationInfo) -> int:
        if "k0" in info.data and value > info.data["k0"]:
            raise ValueError(f"is above k0={info.data['k0']}: fallbacks cannot exceed the first coreset")
        return value
