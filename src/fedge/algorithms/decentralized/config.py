"""The configuration of the decentralized family's FedAvg-FT backbone, with the AFIND+ paper's defaults."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from fedge.algorithms.decentralized.topology import TopologyConfig
from fedge.config import AlgorithmConfig, CodecName, SGDConfig


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

