"""Config blocks of the hierarchical family: the cell hierarchy, its training schedule and its radio.

Defaults follow HIST's FCNN experiments (Sec. VI-B1): 2 cells, ``E = 5`` edge rounds of ``H = 20`` local SGD
steps; batch 50 and plain SGD with ``lr = 0.01`` (the authors' code: the paper gives neither), the fully
non-i.i.d. split, and the wireless values of Sec. VI-C / VI-D.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from fedge.config import AlgorithmConfig, CodecName, SGDConfig, StrictModel

Split = Literal["fully_noniid", "global_shards", "cell_iid", "partition"]


# Bounded as the system keys are (fedge.config.SystemConfig), so that rates and times stay finite
Hertz = Annotated[float, Field(ge=1.0, le=1e12)]
Gigahertz = Annotated[float, Field(ge=1e-9, le=1e6)]  # 1 Hz to 1 PHz


class RadioConfig(StrictModel):
    """HIST's wireless system (Sec. VI-C and VI-D, Eqs. 17-18 and 34-35); only client-side delays count.

    Cells are cut into ``len(snr_db)`` equal bands in order (cell j is in band ``floor(j G / N)``): the
    paper's two bands are the first and second half of the cells. ``cpu_ghz`` holds one ``[low, high]``
    range per band, from which every client draws its CPU frequency each global round.
    """

    bandwidth_hz: Hertz = 9e6
    """uplink bandwidth"""
    snr_db: list[float] = Field(default_factory=lambda: [30.0, 40.0], min_length=1)
    """SNR of each band of cells"""
    cpu_ghz: list[tuple[Gigahertz, Gigahertz]] = Field(
        default_factory=lambda: [(1.0, 2.0), (2.0, 4.0)], min_length=1
    )
    """per band of cells, the [low, high] range of client CPU frequencies"""
    antennas: PositiveInt = 10
    """edge server antennas (AirComp beamforming)"""
    cycles_per_step: Annotated[float, Field(ge=1.0, le=1e18)] = 1e6
    """CPU cycles of one local step on the full model"""
    subcarrier_hz: Hertz = 15e3
    """AirComp: OFDM subcarrier spacing"""
    symbol_s: Annotated[float, Field(ge=1e-12, le=1e3)] = 1.0 / 14e3
    """AirComp: OFDM symbol duration"""
    noise_model: Literal["paper", "real_part"] = "paper"
    """AirComp noise as the paper writes it, or its real part"""
    power_normalisation: Literal["paper", "tight"] = "paper"
    """AirComp power scaling as the paper's, or tight (full client power)"""
    beamformer_restarts: Annotated[int, Field(ge=0)] = 4
    """random restarts of the receive beamformer search"""
    clip: Annotated[float, Field(gt=0.0)] | None = None
    """AirComp: L2 bound on the accumulated gradient a client transmits (set: the receiver noise is
    accounted as a Gaussian mechanism, fedge.privacy.air; unset: nothing bounds it, no guarantee)"""

    @field_validator("cpu_ghz")
    @classmethod
    def _ranges(cls, value: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if any(low > high for low, high in value):
            raise ValueError("every range must be [low, high] with low <= high")
        return value


class HierarchicalConfig(AlgorithmConfig):
    """Knobs shared by HIST and HFedAvg: cells, schedule, optimizer, data split, edge aggregation, radio.

    ``partition.num_clients`` is the number of clients ``K``; ``cells`` edge servers serve
    ``floor(K / cells)`` clients each (contiguous ids), any remainder stays idle (as in the authors' code).
    ``split`` picks the paper's fully non-i.i.d. split (cells own disjoint class ranges, label shards inside
    each cell; recommended), ``global_shards`` (the authors' code's label shards over all clients: cells see
    nearly every class), its cell-i.i.d. split with shards inside each cell, or ``partition`` (the run's
    own ``partition`` block).
    """

    cells: PositiveInt = 2
    """edge servers (cells); clients are split evenly among them"""
    edge_rounds: PositiveInt = 5
    """edge aggregations per global round (E)"""
    local_steps: PositiveInt = 20
    """local steps between edge aggregations (H)"""
    batch_size: PositiveInt = 50
    """samples per local step"""
    optimizer: SGDConfig = Field(default_factory=lambda: SGDConfig(lr=0.01))
    """the clients' local optimizer"""
    split: Split = "fully_noniid"
    """fully_noniid (disjoint class ranges per cell), global_shards, cell_iid, or the run's partition block"""
    shards_per_client: PositiveInt = 2
    """shards each client gets in the paper's splits"""
    aggregation: Literal["oma", "aircomp"] = "oma"
    """edge aggregation by OMA (digital, TDMA) or AirComp (over the air)"""
    radio: RadioConfig = Field(default_factory=RadioConfig)
    """HIST's wireless system"""
    codec_up: CodecName = "fp32"
    """encoding of client-to-edge uploads (OMA only: AirComp's uplink is analogue)"""
    codec_down: CodecName = "fp32"
    """encoding of edge-to-client broadcasts"""
    codec_edge_up: CodecName = "fp32"
    """encoding of edge-to-cloud submodel uploads"""
    codec_edge_down: CodecName = "fp32"
    """encoding of cloud-to-edge broadcasts"""

    @field_validator("codec_up")
    @classmethod
    def _analogue_uplink(cls, value: str, info: ValidationInfo) -> str:
        if value != "fp32" and info.data.get("aggregation") == "aircomp":
            raise ValueError("AirComp's uplink is analogue and takes no codec; use aggregation: oma")
        return value


class HFedAvgConfig(HierarchicalConfig):
    """Hierarchical FedAvg: every client trains the full model (HIST's baseline, Sec. VI-B1)."""

    name: Literal["hfedavg"] = "hfedavg"
    """the algorithm (`fedge list`)"""


class HISTConfig(HierarchicalConfig):
    """HIST: disjoint neuron partitions of the fully connected layers, one per cell, redrawn every round.

    ``mask_sizes`` is ``uniform`` (equal neuron counts, "w/o") or ``optimised`` (latency-minimal sizes of
    Eq. 19 / Eq. 36, "w") with at most ``size_cap`` times the uniform share per cell (19c with
    ``eps_th = 9 delta_1^2``), found by ``solver``. ``form`` is how cells train: ``compact`` gathers each
    cell's neurons into narrow tensors (padded to the widest cell), ``masked`` keeps full-size tensors
    with the other cells' neurons masked to zero; both compute the same update (a test proves it), compact
    with about ``1/N`` of the work.
    """

    name: Literal["hist"] = "hist"
    """the algorithm (`fedge list`)"""
    mask_sizes: Literal["uniform", "optimised"] = "uniform"
    """neurons per cell: uniform, or optimised for latency (Eq. 19 / Eq. 36)"""
    size_cap: Annotated[float, Field(ge=1.0)] = 1.5
    """optimised: at most this many times the uniform share per cell"""
    solver: Literal["greedy", "milp"] = "greedy"
    """optimised: greedy, or the MILP reference (scipy)"""
    form: Literal["compact", "masked"] = "compact"
    """compact (narrow tensors per cell) or masked (full size): the same update"""
