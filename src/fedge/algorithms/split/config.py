"""Knobs shared by every split-learning algorithm (CSE-FSL Sec. VI-A; the SplitFed theory paper's box).

Each algorithm's own config class derives from :class:`SplitConfig` and adds its specific knobs. Names
match FedAvg's where the meaning is the same (``batch_size``, ``local_epochs``, ``optimizer``,
``codec_up``...), so ``fedge compare`` carries them across algorithms. Where the papers leave a choice,
docs/decisions.md gives the reading behind each default.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from fedge.config import AlgorithmConfig, CodecName, SGDConfig

Positive = Annotated[float, Field(gt=0.0)]

# On a CPU the split family's sequential executor is as fast as the batched one or faster below about 20
# clients trained together by a step (LeNet-5 and MLP cuts, 5-40 clients: docs/performance.md), so
# ``engine.executor: auto`` runs it there; from 20 the batched one.
SPLIT_BATCHED_FROM = 20


class SplitConfig(AlgorithmConfig):
    """Local work, step sizes, participation, aggregation, server order, initialisation and codecs.

    - ``local_epochs`` passes over the client's data per round, or exactly ``local_steps`` SGD steps
      (the SplitFed theory paper's K) when that is set. A round is one global round: broadcast, local work
      with its smashed-data traffic, upload and aggregation.
    - ``optimizer`` drives the client trunk (and aux head), its state (momentum, Adam's moments) fresh
      every round (``client_optimizer_state: reset``) or each client's own, kept from its last round
      (``keep``); ``server_optimizer`` the server model
      (default: the same settings, as CSE-FSL's experiments use one step size). Both step sizes decay as
      ``lr * lr_decay**floor((t-1)/lr_decay_every)`` in round t (CSE-FSL Sec. VI-A: CIFAR-10 uses 0.99
      every 10 rounds; the default 1.0 is no decay).
    - ``participation``: ``full`` (every client every round), ``without_replacement`` (``clients_per_round``
      distinct clients) or ``with_replacement`` (``clients_per_round`` i.i.d. uniform draws, the sampling
      of the SplitFed theory paper's Theorems 2 and 4). Duplicate draws run ``independent`` local runs,
      each with its own batch order and server steps (the default: the proofs treat every draw as its own
      noise), or are ``merge``d into one run weighted by multiplicity.
    - Aggregation (FedAvg of the client models, CSE-FSL Eq. 14): ``aggregation`` weights by training-set
      ``size`` (default; equal to Eq. 14's plain mean on equal splits) or ``uniform``;
      ``aggregate_divisor`` ``draws`` divides by the participants (what the theory paper's proofs use)
      while ``all_clients`` reproduces its Algorithm 1 box literally (uniform weights over all m clients;
      a debug switch). ``agg_every`` aggregates every so many local steps inside a round (CSE-FSL's
      aggregation interval C; default: once, at the end of the round, as in its experiments).
    - ``server_order``: the queue order of one shared server model: ``round_robin`` (per step,
      participants in draw order), ``random`` (a fresh seeded permutation per step; CSE-FSL Fig. 6) or
      ``client_after_client`` (each client's whole local run in turn, as the SplitFed paper runs FSL_OC) or
      ``arrival`` (each step's uploads in the order they reach the server on the simulated timeline of the
      system model, plus a seeded uniform jitter of up to ``arrival_jitter_s`` seconds; the round's
      simulated time then includes the queue waits; one shared server model only, see
      :mod:`~fedge.algorithms.split.arrival`).
    - ``server_lr_divide_by_m``: server step size divided by the number of clients (the theory paper's
      Algorithm 1 box; its theorems use the undivided step).
    - ``global_lr``: the step from the old global client model towards the average (eta_g in Yang et
      al.'s notation; 1.0, the default, is plain averaging; other values are our extension).
    - ``freeze_client_after``: clients stop learning after this round, so the server's objective stops
      moving (an ablation: the setting the theory paper's server-side proofs really cover).
    - ``init``: ``torch_default`` or ``normal0.05`` (every weight and bias ~ N(0, 0.05^2), the CSE-FSL
      authors' code's init; the paper gives none); all copies start identical either way.
    - ``codec_up`` encodes smashed data, labels and model uploads; ``codec_down`` gradients and downloads
      (any codec name ``fedge.config.CodecName`` admits: ``fp16``, ``bf16``, ``q8``, ``topk:0.1``...).
    - ``nopeek``: NoPeek's weight alpha (Vepakomma, Gupta, Popescu & Raskar, "NoPeek: Information leakage
      reduction to share activations in distributed deep learning", ICDM Workshops 2020): each client
      step adds ``alpha * DCor(X, Z)``, the distance correlation of the batch's raw inputs and the smashed
      data it sends (:mod:`~fedge.engine.distance_correlation`), to the client's loss; 0 (the default)
      leaves the step as it was. An empirical defence against inverting the smashed data: no epsilon.
    """

    split_dp_sgd: ClassVar[bool] = True
    """``privacy.sample`` makes its client steps DP-SGD (:mod:`fedge.privacy.split_sample` plans them)"""
    name: str
    batch_size: PositiveInt = 10
    """samples per local step"""
    local_epochs: PositiveInt = 1
    """passes over the client's data per round"""
    local_steps: PositiveInt | None = None
    """exactly this many local steps per round instead (the theory paper's K)"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    """optimizer of the client trunk (and aux head)"""
    client_optimizer_state: Literal["reset", "keep"] = "reset"
    """clients' optimizer state: fresh every round (reset) or each client's own across rounds (keep)"""
    server_optimizer: SGDConfig | None = None
    """optimizer of the server part (default: the client's settings)"""
    lr_decay: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    """both step sizes times this every lr_decay_every rounds"""
    lr_decay_every: PositiveInt = 10
    """rounds between step-size decays"""
    participation: Literal["full", "without_replacement", "with_replacement"] = "full"
    """full, without_replacement or with_replacement sampling of clients"""
    clients_per_round: PositiveInt | None = None
    """clients drawn per round when sampling"""
    duplicates: Literal["independent", "merge"] = "independent"
    """with replacement: independent runs per draw, or merged by multiplicity"""
    aggregation: Literal["size", "uniform"] = "size"
    """client models weighted by training-set size or uniformly"""
    aggregate_divisor: Literal["draws", "all_clients"] = "draws"
    """divide by the participants (draws) or by all clients (Algorithm 1's box)"""
    agg_every: PositiveInt | None = None
    """aggregate every this many local steps inside a round (default: once, at its end)"""
    server_order: Literal["round_robin", "random", "client_after_client", "arrival"] = "round_robin"
    """queue order at a shared server: round_robin, random, client_after_client or arrival (simulated)"""
    arrival_jitter_s: Annotated[float, Field(ge=0.0)] = 0.0
    """arrival order: upper end of the seeded uniform jitter added to each upload's arrival (s)"""
    server_lr_divide_by_m: bool = False
    """server step size divided by the number of clients"""
    global_lr: Positive = 1.0
    """step from the old global client model towards the average (1: plain averaging)"""
    freeze_client_after: PositiveInt | None = None
    """clients stop learning after this round (an ablation)"""
    init: Literal["torch_default", "normal0.05"] = "torch_default"
    """torch_default, or normal0.05 (every weight ~ N(0, 0.05^2), the authors' code)"""
    codec_up: CodecName = "fp32"
    """encoding of smashed data, labels and model uploads"""
    codec_down: CodecName = "fp32"
    """encoding of gradients and model downloads"""
    nopeek: Annotated[float, Field(ge=0.0)] = 0.0
    """NoPeek: weight of the inputs-to-smashed-data distance correlation in the client loss (0: off)"""

    @field_validator("aggregate_divisor")
    @classmethod
    def _divisor_needs_uniform(cls, value: str, info: ValidationInfo) -> str:
        if value == "all_clients" and info.data.get("aggregation") != "uniform":
            raise ValueError("all_clients needs aggregation=uniform")
        return value


class GradientReturnConfig(SplitConfig):
    """SplitFed (FSL_MC / FSL_OC): cut-layer gradients come back; optional global-norm clipping of the
    server gradient and of each client's gradient at ``clip_norm`` (CSE-FSL Sec. VI-A clips FSL_OC without
    naming a threshold)."""

    returns_cut_gradient: ClassVar[bool] = True
    """every sent sample's cut gradient comes back: the privacy planner counts those releases too"""

    clip_norm: Positive | None = None
    """global-norm clipping of server and client gradients (default: none)"""


class AuxHeadConfig(SplitConfig):
    """Local-loss split learning (FSL_AN / CSE-FSL): the smashed data sent is from the local step's own
    forward pass (``pre_step``, default, as the authors' code) or from one extra forward pass after it
    (``post_step``, closer to CSE-FSL Eq. 11's notation). The aux head's architecture is ``model.aux``
    (default: the paper's linear "MLP" head). ``aggregate_aux: false`` keeps each client's aux head local:
    never sent, never averaged (an ablation; the default averages it with the trunk, CSE-FSL Eq. 14)."""

    smashed_from: Literal["pre_step", "post_step"] = "pre_step"
    """smashed data from the local step's forward pass (pre_step) or one after it"""
    aggregate_aux: bool = True
    """average the aux heads with the trunks (false: each stays local)"""


class ServerCopiesConfig(SplitConfig):
    """Algorithms with one server copy per participant (FSL_MC, FSL_AN): the copies are averaged at every
    aggregation (the paper does not say; one model must be evaluated); ``copies_eval`` evaluates with that
    average (``avg``) or with the first participant's copy before averaging (``copy0``)."""

    copies_eval: Literal["avg", "copy0"] = "avg"
    """evaluate with the averaged server copy (avg) or the first participant's (copy0)"""
