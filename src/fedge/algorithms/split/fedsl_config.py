"""The configs of lightweight FedSL and its baseline traditional FedSL, and the compression a run resolves
them to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import Field, PositiveInt, StringConstraints

from fedge.config import AlgorithmConfig, SGDConfig

# the returned cut-layer gradient: fp32, fp16 or the q-bit stochastic quantizer (a sign and q level bits
# per kept value, one 64-bit range per client and message)
GradientCodec = Annotated[str, StringConstraints(pattern=r"^(fp32|fp16|q([1-9]|[12][0-9]|3[01]))$")]


class FedSLConfig(AlgorithmConfig):
    """Knobs shared by lightweight FedSL and its baseline, traditional FedSL (Sec. IV).

    - ``batch_size`` per client and round (the paper gives none; 32 suits CPU-sized runs); a round is one
      step.
    - ``drop_last``: an epoch's short last batch is skipped (needed for exact executor agreement with
      BatchNorm, as elsewhere in the engine).
    - ``optimizer``: one constant step size for client and server, plain SGD (Eqs. 7, 13): momentum and
      weight decay are rejected.
    - ``init``: ``torch_default`` or ``normal0.05`` (as the split family); all clients start identical.
    - ``codec_up`` encodes the kept smashed values, ``codec_down`` the returned gradient values (``fp32``,
      ``fp16``, or ``q<bits>``: the cut-layer gradient stochastically quantized, its draws from the link);
      ``model_codec`` the client-model uploads and broadcasts: dense ``fp32`` (the default) or
      ``sparse`` (cheapest of bitmap / coordinate list, which pays off on pruned trunks).
    - ``server_order``: on the simulated clock the one server model serves every client's batch as a
      parallel copy (``parallel``, the default) or one upload after another in the order they arrive
      (``arrival``: client compute, uplink and a seeded uniform jitter of up to ``arrival_jitter_s``
      seconds; the queue waits enter the round's time). The model is the same either way (Eq. 7 steps
      once with the mean gradient at one set of weights).
    """

    split_dp_sgd: ClassVar[bool] = True
    """``privacy.sample`` makes its client update DP-SGD (:mod:`fedge.privacy.split_sample` plans it)"""
    step_rounds: ClassVar[bool] = True
    """a round is one step of every client, its epochs spanning rounds (:mod:`fedge.privacy.cut`)"""
    returns_cut_gradient: ClassVar[bool] = True
    """every sent sample's cut gradient comes back (planned with ``privacy.cut.gradient_clip``)"""
    name: str
    batch_size: PositiveInt = 32
    """samples per client and round (a round is one step)"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    """one constant SGD step size for client and server (no momentum, no decay)"""
    init: Literal["torch_default", "normal0.05"] = "torch_default"
    """torch_default, or normal0.05 (every weight ~ N(0, 0.05^2))"""
    codec_up: Literal["fp32", "fp16"] = "fp32"
    """encoding of uploads (smashed data, labels)"""
    codec_down: GradientCodec = "fp32"
    """encoding of downloads (cut-layer gradients): fp32, fp16 or q1..q31"""
    model_codec: Literal["fp32", "fp16", "sparse"] = "fp32"
    """encoding of client-model uploads and broadcasts: fp32, fp16 or sparse"""
    server_order: Literal["parallel", "arrival"] = "parallel"
    """the simulated clock: parallel service, or a FIFO queue in simulated arrival order"""
    arrival_jitter_s: Annotated[float, Field(ge=0.0)] = 0.0
    """arrival order: upper end of the seeded uniform jitter added to each upload's arrival (s)"""


class TraditionalFedSLConfig(FedSLConfig):
    """Traditional FedSL: batch size, step size, initialisation and codecs only (every compression is
    off, so ``fedge compare`` drops the compression keys)."""

    name: Literal["fedsl"] = "fedsl"
    """the algorithm (`fedge list`)"""


class LightFedSLConfig(FedSLConfig):
    """The compression knobs of lightweight FedSL; defaults are the paper's Figs. 3-4 setting.

    - ``final_sparsity`` (rho_f, Eq. 10) reached at round ``schedule_rounds`` (T; default: the run's
      rounds); 0 turns pruning off.
    - ``quant_bits`` (q, Eqs. 11-12), ``null`` or 32 for full precision; ``quant_granularity``: one
      (g_min, g_max) pair for the whole client gradient (``vector``, the paper's) or per tensor.
    - ``cut_dropout`` (p, Eq. 3): element-wise inverted dropout of the cut-layer output, the mask
      from a seed both ends share.
    - ``agg_interval`` (I, Eq. 14): client models are averaged at rounds ``t`` with ``t mod I == 0``.
    """

    name: Literal["light_fedsl"] = "light_fedsl"
    """the algorithm (`fedge list`)"""
    final_sparsity: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.35
    """share of client weights pruned by the end of the schedule (rho_f; 0: off)"""
    schedule_rounds: PositiveInt | None = None
    """round at which pruning reaches final_sparsity (T; default: the run's rounds)"""
    quant_bits: Annotated[int, Field(ge=1, le=32)] | None = 8
    """bits per client-gradient entry (q; null or 32: full precision)"""
    quant_granularity: Literal["vector", "tensor"] = "vector"
    """one quantisation range for the whole gradient (vector) or per tensor"""
    cut_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.3
    """dropout rate of the cut-layer output (p), mask from a shared seed"""
    agg_interval: PositiveInt = 5
    """client models are averaged every this many rounds (I)"""


@dataclass(frozen=True)
class Compression:
    """What lightweight FedSL changes against traditional FedSL, resolved for one run."""

    final_sparsity: float
    schedule_rounds: int
    quant_bits: int | None
    quant_granularity: Literal["vector", "tensor"]
    cut_dropout: float
    agg_interval: int
