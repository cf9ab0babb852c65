"""Knobs shared by every split-learning algorithm (cse-fsl §2.6 and §8, sfl-theory §1.2-1.3 and §6).

Each algorithm's own config class derives from :class:`SplitConfig` and adds its specific knobs. Names
match FedAvg's where the meaning is the same (``batch_size``, ``local_epochs``, ``optimizer``,
``codec_up``...), so ``fedge compare`` carries them across algorithms.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from fedge.config import AlgorithmConfig, SGDConfig

Positive = Annotated[float, Field(gt=0.0)]


class SplitConfig(AlgorithmConfig):
    """Local work, step sizes, participation, aggregation, server order, initialisation and codecs.

    - ``local_epochs`` passes over the client's data per round, or exactly ``local_steps`` SGD steps
      (sfl-theory's K) when that is set. A round is one global round: broadcast, local work with its
      smashed-data traffic, upload and aggregation.
    - ``optimizer`` drives the client trunk (and aux head); ``server_optimizer`` the server model
      (default: the same settings, cse-fsl §8 A6). Both step sizes decay as
      ``lr * lr_decay**floor((t-1)/lr_decay_every)`` in round t (cse-fsl §8 A7: CIFAR uses 0.99 every 10
      rounds; the default 1.0 is no decay).
    - ``participation``: ``full`` (every client every round), ``without_replacement`` (``clients_per_round``
      distinct clients) or ``with_replacement`` (``clients_per_round`` i.i.d. uniform draws, sfl-theory
      §1.2). Duplicate draws run ``independent`` local runs, each with its own batch order and server
      steps (sfl-theory §6.2, the default), or are ``merge``d into one run weighted by multiplicity.
    - Aggregation (FedAvg of the client models, cse-fsl Eq. 14): ``aggregation`` weights by training-set
      ``size`` (cse-fsl §8 A5, default) or ``uniform``; ``aggregate_divisor`` ``draws`` divides by the
      participants (sfl-theory §6.1's choice) while ``all_clients`` reproduces the theory paper's box
      literally (uniform weights over all m clients; a debug switch). ``agg_every`` aggregates every so
      many local steps inside a round (cse-fsl §8 A4's ``c``; default: once, at the end of the round).
    - ``server_order``: the queue order of one shared server model (cse-fsl §2.5): ``round_robin`` (per
      step, participants in draw order), ``random`` (a fresh seeded permutation per step) or
      ``client_after_client`` (each client's whole local run in turn, as the SplitFed paper runs FSL_OC).
    - ``server_lr_divide_by_m``: server step size divided by the number of clients (sfl-theory's box).
    - ``global_lr``: sfl-theory's eta_g, the step from the old global client model towards the average
      (1.0, the default, is plain averaging; other values are the spec's extension).
    - ``freeze_client_after``: clients stop learning after this round, so the server's objective stops
      moving (sfl-theory §5.1's ablation: the setting its server proof covers).
    - ``init``: ``torch_default`` or ``normal0.05`` (every weight and bias ~ N(0, 0.05^2), the CSE-FSL
      code's init, cse-fsl §8 A8); all copies start identical either way.
    - ``codec_up`` encodes smashed data, labels and model uploads; ``codec_down`` gradients and downloads.
    """

    name: str
    batch_size: PositiveInt = 10
    local_epochs: PositiveInt = 1
    local_steps: PositiveInt | None = None
    drop_last: bool = False
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    server_optimizer: SGDConfig | None = None
    lr_decay: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    lr_decay_every: PositiveInt = 10
    participation: Literal["full", "without_replacement", "with_replacement"] = "full"
    clients_per_round: PositiveInt | None = None
    duplicates: Literal["independent", "merge"] = "independent"
    aggregation: Literal["size", "uniform"] = "size"
    aggregate_divisor: Literal["draws", "all_clients"] = "draws"
    agg_every: PositiveInt | None = None
    server_order: Literal["round_robin", "random", "client_after_client"] = "round_robin"
    server_lr_divide_by_m: bool = False
    global_lr: Positive = 1.0
    freeze_client_after: PositiveInt | None = None
    init: Literal["torch_default", "normal0.05"] = "torch_default"
    codec_up: Literal["fp32", "fp16"] = "fp32"
    codec_down: Literal["fp32", "fp16"] = "fp32"

    @field_validator("aggregate_divisor")
    @classmethod
    def _divisor_needs_uniform(cls, value: str, info: ValidationInfo) -> str:
        if value == "all_clients" and info.data.get("aggregation") != "uniform":
            raise ValueError("all_clients needs aggregation=uniform")
        return value


class GradientReturnConfig(SplitConfig):
    """SplitFed (FSL_MC / FSL_OC): cut-layer gradients come back; optional global-norm clipping of the
    server gradient and of each client's gradient at ``clip_norm`` (cse-fsl §3.2, §8 A10)."""

    clip_norm: Positive | None = None


class AuxHeadConfig(SplitConfig):
    """Local-loss split learning (FSL_AN / CSE-FSL): the smashed data sent is from the local step's own
    forward pass (``pre_step``, default) or from one extra forward pass after it (``post_step``), cse-fsl
    §8 A2. The aux head's architecture is ``model.aux`` (default: the paper's linear "MLP" head).
    ``aggregate_aux: false`` keeps each client's aux head local: never sent, never averaged
    (sfl-theory §5.1's ablation; the default averages it with the trunk, cse-fsl Eq. 14)."""

    smashed_from: Literal["pre_step", "post_step"] = "pre_step"
    aggregate_aux: bool = True


class ServerCopiesConfig(SplitConfig):
    """Algorithms with one server copy per participant (FSL_MC, FSL_AN): the copies are averaged at every
    aggregation (cse-fsl §8 A9); ``copies_eval`` evaluates with that average (``avg``) or with the first
    participant's copy before averaging (``copy0``)."""

    copies_eval: Literal["avg", "copy0"] = "avg"
