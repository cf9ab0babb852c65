"""Run configuration as data: pydantic v2 models, YAML loading and dotted ``key=value`` overrides.

A run is fully described by one :class:`RunConfig`. Unknown keys (with the nearest valid one suggested)
and impossible values are rejected with a :class:`~fedge.errors.ConfigError` whose one-line message names
the key. Every block refuses what no run can use: NaN and infinite numbers, true/false where a number is
expected, integers beyond 64 bits, floats beyond float32 and NUL characters. Checks that need the data
or the model (more clients than samples, a cut beyond the model's depth) happen when the run is built,
and raise the same error.
"""

from __future__ import annotations

import difflib
import math
import re
import types
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fedge.errors import ConfigError

T = TypeVar("T")

Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
# A link's codec by name (comm/registry.py builds it): dense ``fp32`` / ``fp16`` / ``bf16``, lossless
# ``sparse`` / ``bitmap``, ``q<bits>`` (stochastic quantizer, 1..31 bits), ``topk:<fraction>`` or
# ``randk:<fraction>`` (sparsification keeping that share of each tensor's entries).
CODEC_PATTERN = re.compile(
    r"^(fp32|fp16|bf16|sparse|bitmap|q(?:[1-9]|[12][0-9]|3[01])|(topk|randk):(0?\.[0-9]*[1-9][0-9]*|1(?:\.0*)?))$"
)


def _codec_name(value: str) -> str:
    if not CODEC_PATTERN.match(value):
        raise ValueError(
            f"unknown codec {value!r}; use fp32, fp16, bf16, sparse, bitmap, q1..q31, topk:<fraction> or "
            "randk:<fraction> (a fraction in (0, 1])"
        )
    return value


CodecName = Annotated[str, AfterValidator(_codec_name)]
DATASETS = ("digits", "synthetic", "mnist", "fashion-mnist", "cifar10", "cifar100", "femnist")
TEXT_DATASETS = ("pystdlib", "text", "shakespeare")  # token sequences for language models
DATASETS += TEXT_DATASETS
DATASETS += ("textcls",)  # token sequences labeled by class, for sequence classifiers
LINE_DATASETS = ("text", "pystdlib", "textcls")  # text read one sample per line (data.sequences: lines)
CUSTOM_DATA = "custom"  # data handed to fedge.run(train=..., test=...)
DEFAULT_ALGORITHM = "fedavg"
PARTITIONERS = ("iid", "dirichlet", "pathological", "shards", "natural", "grouped")
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38  # config numbers end up in float32 tensors
NAME_BYTES = 200  # longest run name: room for the "-N" suffix and the hidden staging name within 255


def _names(info: ValidationInfo, kind: str) -> set[str]:
    """The names of ``kind`` a validation context admits besides the registries (:func:`parse_config`)."""
    return set((info.context or {}).get(kind, ()))


def _leaf_types(annotation: Any) -> set[Any]:
    """The scalar types an annotation admits, looking inside ``Annotated``, unions, lists and tuples."""
    origin = get_origin(annotation)
    if origin is None:
        return {annotation}
    if origin is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, tuple, Literal):
        if origin is Literal:
            return {type(arg) for arg in get_args(annotation)}
        return set().union(*(_leaf_types(arg) for arg in get_args(annotation) if arg is not Ellipsis))
    return {origin}


def _check_scalar(value: Any, admitted: set[Any]) -> None:
    """Raise ``ValueError`` for a value no run can use, whatever the field's own bounds say."""
    numeric = bool(admitted & {int, float}) and bool not in admitted
    if isinstance(value, bool) and numeric:
        raise ValueError(f"expected a number, got {str(value).lower()}")
    whole = isinstance(value, int) or (isinstance(value, float) and int in admitted and float not in admitted)
    if whole and not isinstance(value, bool) and abs(value) > INT64_MAX:
        raise ValueError("is too large (at most 2^63 - 1)")
    if isinstance(value, float) and FLOAT32_MAX < abs(value) < math.inf:  # NaN and inf: "finite number"
        raise ValueError("is too large (at most 3.4e38, float32's largest)")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("must not contain a NUL character")


def aliased(default: T, *names: str) -> T:
    """A field's default, with the key written in several spellings: the first is the descriptive key configs
    are written with, the others (the paper's symbol among them) are accepted too. The attribute's own name
    must be one of them: ``h: int = aliased(1, "upload_every", "h")``. A function, not ``Field(**settings)``,
    so type checkers still see the field's type and default."""
    return Field(default, validation_alias=AliasChoices(*names), serialization_alias=names[0])


def config_keys(block: type[BaseModel]) -> list[str]:
    """Every key a config block accepts: each field's descriptive key first, then its other spellings."""
    found: list[str] = []
    for name, field in block.model_fields.items():
        choices = field.validation_alias.choices if isinstance(field.validation_alias, AliasChoices) else []
        for key in (field.serialization_alias or name, *map(str, choices), name):
            if key not in found:
                found.append(key)
    return found


class StrictModel(BaseModel):
    """Base of every config block: unknown keys are errors, assignments are validated, and numbers must be
    finite (``allow_inf_nan=False``)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, use_attribute_docstrings=True
    )

    @field_validator("*", mode="before")
    @classmethod
    def _usable(cls, value: Any, info: ValidationInfo) -> Any:
        """No true/false for a number, no integer beyond 64 bits or float beyond float32, no NUL character
        (also inside lists)."""
        admitted = _leaf_types(cls.model_fields[info.field_name].annotation)
        for item in value if isinstance(value, list | tuple) else (value,):
            _check_scalar(item, admitted)
        return value


class DataConfig(StrictModel):
    """Which dataset, from where. Fields after ``download`` apply to some sources only."""

    name: str = Field("digits", description="a built-in dataset (`fedge list`), a registered one, or custom")
    root: Path | None = None
    """folder of the dataset files (default: the source's own search path)"""
    download: bool = False
    """download the dataset when its files are missing"""
    train_limit: PositiveInt | None = None
    """use a seeded random subset of this many training samples"""
    test_limit: PositiveInt | None = None
    """use a seeded random subset of this many test samples"""
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    """share held out for testing where a source (or custom data) has no test split"""
    num_train: PositiveInt = 2000
    """synthetic: training samples"""
    num_test: PositiveInt = 500
    """synthetic: test samples"""
    num_classes: Annotated[int, Field(ge=2)] = 10
    """synthetic: classes"""
    shape: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 8], min_length=1, max_length=3)
    """synthetic: shape of one sample ([C, H, W] or fewer dimensions)"""
    crop: PositiveInt | None = None
    """centre-crop images to crop x crop (CSE-FSL's 24x24 CIFAR input)"""
    seq_len: PositiveInt = 64
    """text: tokens per sequence (documents are packed into sequences of this length)"""
    tokenizer: str = "bytes"
    """text: bytes (UTF-8 bytes, 256 tokens) or a Hugging Face tokenizer name or folder"""
    text_bytes: PositiveInt | None = None
    """text: bytes read from the start of each document (default: all)"""
    sequences: Literal["windows", "lines"] = "windows"
    """text, pystdlib, textcls: a sample is a full seq_len window of a document (language models: packed),
    or a line cut and right-padded to seq_len"""

    registered: ClassVar[set[str]] = set()  # names added by fedge.register_dataset / entry points

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, value: str, info: ValidationInfo) -> str:
        known = (*DATASETS, *sorted({*cls.registered, *_names(info, "datasets")}), CUSTOM_DATA)
        if value not in known:
            near = difflib.get_close_matches(value, known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(known)}"
            raise ValueError(f"unknown dataset {value!r}; {hint}")
        return value

    @field_validator("sequences")
    @classmethod
    def _padded_for_classifiers(cls, value: str, info: ValidationInfo) -> str:
        if value == "lines" and info.data.get("name") not in LINE_DATASETS:
            known = ", ".join(LINE_DATASETS)
            raise ValueError(f"lines (a padded sequence per line) is for text data: {known}")
        return value


class PartitionConfig(StrictModel):
    """How training samples are divided among clients, and the size of each client's test set."""

    kind: Literal[PARTITIONERS] = "dirichlet"  # type: ignore[valid-type]
    """the partitioner: iid, dirichlet, pathological, shards, natural (writers) or grouped"""
    num_clients: PositiveInt = 10
    """number of clients"""
    alpha: Annotated[float, Field(gt=0.0)] = 0.5
    """dirichlet: concentration (smaller is more skewed)"""
    min_size: Annotated[int, Field(ge=1)] = 10
    """dirichlet: smallest client training set accepted (redrawn below it)"""
    max_retries: PositiveInt = 100
    """dirichlet: redraws before giving up on min_size"""
    classes_per_client: PositiveInt = 2
    """pathological: classes each client holds"""
    shards_per_client: PositiveInt = 2
    """shards: label-sorted shards each client gets"""
    num_groups: PositiveInt = 4
    """grouped: groups of clients with disjoint classes"""
    test_size: PositiveInt | None = None
    """test samples per client, following its label distribution (default: a fair share)"""


class AuxConfig(StrictModel):
    """A client-side auxiliary head (split learning with local loss)."""

    kind: Literal["linear", "mlp", "cnn_mlp"] = "linear"
    """linear, mlp (one hidden layer) or cnn_mlp (1x1 conv then linear)"""
    channels: PositiveInt | None = None
    """cnn_mlp: channels of the 1x1 convolution"""
    hidden: PositiveInt | None = None
    """mlp: width of the hidden layer"""


class ModelConfig(StrictModel):
    """A splittable model from the zoo, where to cut it, and builder options."""

    name: str = "mlp"
    """a zoo model (`fedge list`), a registered one, or custom (fedge.run(model=...))"""
    cut: int | str | None = None
    """split learning: blocks on the client side, or the name of the last client block"""
    aux: AuxConfig | None = None
    """split learning with a local loss: the client's auxiliary head (default: linear)"""
    options: dict[str, Any] = Field(default_factory=dict)
    """the model builder's options (`fedge list` shows each model's)"""

    @field_validator("cut")
    @classmethod
    def _positive_cut(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"Input should be greater than 0 (got {value})")
        return value


class OptimizerConfig(StrictModel):
    """The local optimizer: SGD (momentum, weight decay) or Adam, each with PyTorch's update rule."""

    kind: Literal["sgd", "adam"] = Field(
        default="sgd", description="sgd (torch.optim.SGD) or adam (torch.optim.Adam)"
    )
    lr: Annotated[float, Field(gt=0.0, description="step size (eta in the papers)")] = 0.05
    momentum: Annotated[float, Field(ge=0.0, lt=1.0, description="SGD's heavy-ball momentum (sgd only)")] = (
        0.0
    )
    weight_decay: Annotated[float, Field(ge=0.0, description="L2 penalty added to the gradient")] = 0.0
    beta1: Annotated[float, Field(ge=0.0, lt=1.0, description="Adam's first-moment decay (adam only)")] = 0.9
    beta2: Annotated[float, Field(ge=0.0, lt=1.0, description="Adam's second-moment decay (adam only)")] = (
        0.999
    )
    eps: Annotated[float, Field(gt=0.0, description="Adam's denominator floor (adam only)")] = 1e-8

    @model_validator(mode="after")
    def _settings_of_kind(self) -> OptimizerConfig:
        if self.kind == "adam" and self.momentum:
            raise ValueError("momentum is SGD's; Adam uses beta1 and beta2")
        return self


SGDConfig = OptimizerConfig  # the name algorithm configs were written with


class TrainConfig(StrictModel):
    """The local training loss of every client (the optimizer is the algorithm's: ``algorithm.optimizer``,
    since algorithms differ in how many they run: split learning has a client and a server optimizer)."""

    loss: Literal["cross_entropy"] = Field(
        "cross_entropy", description="the per-sample loss; fedge.run(loss=callable) passes any other"
    )
    label_smoothing: Annotated[
        float, Field(ge=0.0, lt=1.0, description="cross-entropy's label smoothing")
    ] = 0.0


class AlgorithmConfig(StrictModel):
    """Base of every algorithm's own config; ``name`` picks the registered algorithm."""

    name: str
    """the registered algorithm (`fedge list`)"""
    registry: ClassVar[dict[str, type[AlgorithmConfig]]] = {}


def register_algorithm_config(name: str):
    """Class decorator: make ``cls`` the config class of algorithm ``name``."""

    def wrap(cls: type[AlgorithmConfig]) -> type[AlgorithmConfig]:
        AlgorithmConfig.registry[name] = cls
        return cls

    return wrap


class EngineConfig(StrictModel):
    """Where and how local training runs."""

    executor: Literal["auto", "sequential", "batched"] = "auto"
    """batched (vmap over clients), sequential (one client at a time; same numbers within rounding) or
    auto: the faster for the run (batched on a GPU; on a CPU, per algorithm family and clients a step)"""
    device: str = "cpu"
    """cpu or cuda[:index]"""
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    """torch CPU threads (default: torch's own)"""
    compile: bool = False
    """torch.compile the batched executor's step (first rounds pay compilation)"""
    fused: bool = True
    """batched kernels beyond vmap: dense networks (Linear/ReLU, cross-entropy) skip autograd (batched
    clients, split's shared server); LoRA transformers fold every client's batch into one plain pass"""
    retain_memory: bool = True
    """on CPU, keep freed memory for reuse"""
    dist_timeout: Annotated[float, Field(gt=0.0, le=86400.0)] = 300.0
    """seconds a collective waits for the other ranks of a torchrun-launched run"""


Ranges = list[tuple[float, float]]
# a device figure as written: a number, a [low, high] range or a list of ranges (always ranges once read)
DeviceFigure = float | tuple[float, float] | Ranges
DEVICE_FIGURES = ("cpu_hz", "distance_m", "bandwidth_hz", "shadowing_db", "energy_budget_j", "availability")
FIGURE_BOUNDS = {  # each figure's physical range (the system keys' bounds): rates and times stay finite
    "cpu_hz": (1.0, 1e15),
    "distance_m": (1.0, 1e7),
    "bandwidth_hz": (1.0, 1e12),
    "shadowing_db": (-200.0, 200.0),
    "energy_budget_j": (1e-12, 1e30),
    "availability": (0.0, 1.0),  # a probability: above 0, at most 1
}


def figure_out_of_bounds(name: str, value: float) -> str | None:
    """Why ``value`` is no value of device figure ``name`` (``None``: it is one)."""
    low, high = FIGURE_BOUNDS[name]
    if name != "shadowing_db" and value <= 0.0:
        return f"{name} must be positive (got {value:g})"
    if name == "availability":
        return None if value <= 1.0 else f"{name} is at most 1 (got {value:g})"
    return None if low <= value <= high else f"{name} must be between {low:g} and {high:g} (got {value:g})"


def _ranges(value: Any) -> Any:
    """A device figure as groups of ``[low, high]`` ranges: a number is one fixed value, a pair one range."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [(value, value)]
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
        return [tuple(value)]
    return value


class DevicesConfig(StrictModel):
    """Per-client device profiles (docs/async.md): compute speed, radio, energy budget and availability.

    Each figure is a number (every client alike), a ``[low, high]`` range drawn per client, or a list of
    ranges: the clients are split into that many equal consecutive groups, each drawn from its own range
    (HIST's halves at 1-2 GHz and 2-4 GHz: ``cpu_hz: [[1e9, 2e9], [2e9, 4e9]]``). Draws are uniform, or
    log-uniform with ``spread: log``, from the run seed. A figure left out keeps the system's own value.
    ``file`` (CSV or JSON, one row per client) overrides drawn figures column by column; ``trace`` (CSV,
    one row per round, one 0/1 column per client) replaces the availability draws. Every figure is bounded
    as the system key it stands for is (1 Hz to 1 PHz, 1 m to 10,000 km, 1 Hz to 1 THz, -200 to 200 dB, a
    budget from 1 pJ), in ranges and files alike, so that rates, times and energies stay finite.
    """

    cpu_hz: DeviceFigure | None = None
    """processor speed, cycles per second (default: system.client_cpu_hz)"""
    distance_m: DeviceFigure | None = None
    """distance from the base station (default: system.distance_min_m..distance_max_m)"""
    bandwidth_hz: DeviceFigure | None = None
    """the client's sub-channel bandwidth (default: system.bandwidth_hz)"""
    shadowing_db: DeviceFigure | None = None
    """extra path loss in dB on top of the 3GPP model (walls, antenna): lowers the client's SNR"""
    energy_budget_j: DeviceFigure | None = None
    """joules a client may spend in the run; once spent it is unavailable (default: unlimited)"""
    availability: DeviceFigure | None = None
    """probability that a client is online in a round, drawn per round (default: always online)"""
    spread: Literal["uniform", "log"] = "uniform"
    """how a range is drawn: uniformly or log-uniformly"""
    file: Path | None = None
    """CSV or JSON of per-client figures (columns client, cpu_hz, distance_m, ...), e.g. measured devices"""
    trace: Path | None = None
    """CSV availability trace: row r is round r (cycled), column i client i, 1 online / 0 offline"""

    @field_validator(*DEVICE_FIGURES, mode="before")
    @classmethod
    def _as_ranges(cls, value: Any) -> Any:
        return _ranges(value)

    @field_validator(*DEVICE_FIGURES)
    @classmethod
    def _positive_ranges(cls, value: Ranges | None, info: ValidationInfo) -> Ranges | None:
        name = str(info.field_name)
        signed = name == "shadowing_db"
        for low, high in value or []:
            if not (signed or low > 0.0) or not low <= high:
                kind = "numbers" if signed else "positive numbers"
                raise ValueError(f"[{low}, {high}] is no range of {kind} with low <= high")
            if name == "availability" and high > 1.0:
                raise ValueError(f"[{low}, {high}]: a probability is at most 1")
            reason = figure_out_of_bounds(name, low) or figure_out_of_bounds(name, high)
            if reason is not None:
                raise ValueError(f"[{low:g}, {high:g}]: {reason.removeprefix(name + ' ')}")
        if value is not None and not value:
            raise ValueError("needs at least one range")
        return value


class SystemConfig(StrictModel):
    """Wireless system model behind the simulated clock (``sim_seconds``, ``sim_joules``).

    Radio defaults are lightweight FedSL's Sec. IV values (5 MHz sub-channel per client, 23 dBm client
    and 37 dBm base-station transmit power, -174 dBm/Hz noise, clients 100-300 m away). Fading and the
    compute and energy model are our completion of the papers, which give none (docs/decisions.md,
    "Platform"), each node kind at a plausible efficiency for its class of hardware: a client is a
    phone-class processor at 1 GHz, one FLOP per cycle, drawing ``kappa f^3`` = 0.1 W while it computes
    (``kappa`` = 1e-28, ``kappa f^2`` = 0.1 nJ per cycle, the usual mobile-edge value): 10 GFLOP/J, the
    order of a mobile SoC's CPU cores (a few to about ten GFLOP per joule). The server does 1e11 cycles
    per second in all (a multi-core node or accelerator serving every client: 100 times a client, not
    one 100 GHz core) and is charged ``server_compute_w`` = 2 W for them: 50 GFLOP/J, the FP32 efficiency
    of a data-centre GPU at its rated power (tens of GFLOP per joule: for instance 19.5 TFLOP/s at 400 W,
    the order of the Green500 list's leading systems), so the share of such a node's draw that 1e11
    FLOP/s take. The run summary and ``fedge report`` print these figures beside the joules
    (:func:`fedge.system.model.energy_assumption`). Transmit energy is the transmit
    power times the airtime; receiving and idling cost nothing.

    Every value is bounded far beyond any radio or processor (1 Hz to 1 THz, -100 to 100 dBm, 1 m to
    10,000 km, up to 1 PHz) so that rates, times and energies stay finite numbers.
    """

    bandwidth_hz: Annotated[float, Field(ge=1.0, le=1e12)] = 5e6
    """bandwidth of each client's orthogonal sub-channel"""
    client_power_dbm: Annotated[float, Field(ge=-100.0, le=100.0)] = 23.0
    """client transmit power (23 dBm = 0.2 W)"""
    server_power_dbm: Annotated[float, Field(ge=-100.0, le=100.0)] = 37.0
    """server (base station) transmit power (37 dBm = 5 W)"""
    noise_dbm_per_hz: Annotated[float, Field(ge=-300.0, le=0.0)] = -174.0
    """noise power spectral density"""
    distance_min_m: Annotated[float, Field(ge=1.0, le=1e7)] = 100.0
    """nearest client distance from the server"""
    distance_max_m: Annotated[float, Field(ge=1.0, le=1e7, validate_default=True)] = 300.0
    """farthest client distance from the server"""
    distances: Literal["uniform", "linspace"] = "uniform"
    """client distances drawn uniformly (seeded) or evenly spaced"""
    fading: Literal["none", "rayleigh"] = "none"
    """small-scale fading on top of path loss: none or Rayleigh (redrawn per round)"""
    client_cpu_hz: Annotated[float, Field(ge=1.0, le=1e15)] = 1e9
    """client processor speed, cycles per second (our completion: a 1 GHz phone-class core)"""
    server_cpu_hz: Annotated[float, Field(ge=1.0, le=1e15)] = 1e11
    """server throughput, cycles per second over all its cores (our completion: 100x a client)"""
    cycles_per_flop: Annotated[float, Field(gt=0.0, le=1e9)] = 1.0
    """processor cycles per floating-point operation (client and server)"""
    kappa: Annotated[float, Field(ge=0.0, le=1.0)] = 1e-28
    """clients' effective switched capacitance: energy kappa f^2 per cycle (0.1 nJ at 1 GHz: 10 GFLOP/J)"""
    server_compute_w: Annotated[float, Field(ge=0.0, le=1e9)] = 2.0
    """server power charged while it computes, in watts (our completion: 2 W for 1e11 FLOP/s, 50 GFLOP/J,
    a data-centre GPU's efficiency)"""
    devices: DevicesConfig | None = None
    """per-client device profiles: compute, radio, energy budget, availability (docs/async.md)"""

    @field_validator("distance_max_m")
    @classmethod
    def _distance_range(cls, value: float, info: ValidationInfo) -> float:
        if value < info.data.get("distance_min_m", 0.0):
            raise ValueError("must be >= system.distance_min_m")
        return value


class EvalConfig(StrictModel):
    """Evaluation schedule: every ``every`` rounds and always after the last round."""

    every: PositiveInt = 1
    """evaluate every this many rounds (and always after the last)"""
    batch_size: PositiveInt = 2048
    """samples per evaluation batch (memory only: results do not depend on it)"""
    attacks: list[str] = Field(default_factory=list)
    """attacks of `fedge attack` run on every recorded round (output.record_every), figures in the rows"""


RECORDED = ("smashed", "cut_gradients", "labels", "updates")
"""What ``output.record`` may keep: the smashed data the server receives, the cut gradients it returns,
the labels it receives, and the client updates a FedAvg server receives."""


class OutputConfig(StrictModel):
    """The results directory ``dir/name`` and what goes in it. ``name`` is one folder name."""

    dir: Path = Path("runs")
    """folder that holds the run directories"""
    name: str | None = None
    """the run directory's name (default: ALGORITHM-DATASET; -2, -3... when taken)"""
    checkpoint_every: PositiveInt = 1
    """write a checkpoint every this many rounds (and at the end)"""
    plots: bool = True
    """draw the accuracy plots at the end"""
    record: list[Literal[RECORDED]] = Field(default_factory=list)  # type: ignore[valid-type]
    """transfers kept for `fedge attack`: smashed, cut_gradients, labels (split), updates (FedAvg)"""
    record_every: PositiveInt = 1
    """record rounds 1, 1 + every, 1 + 2 every... (and the last)"""
    record_samples: PositiveInt = 256
    """cut transfers kept per recorded round (a seeded uniform sample), and inputs per recorded update"""
    record_clients: PositiveInt = 4
    """client updates kept per recorded round (a seeded uniform sample of the participants)"""

    @field_validator("record")
    @classmethod
    def _distinct_kinds(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("names a kind twice")
        return value

    @field_validator("dir")
    @classmethod
    def _dir_parts(cls, value: Path) -> Path:
        if any(len(part.encode()) > 255 for part in value.parts):
            raise ValueError("has a folder name longer than 255 bytes")
        return value

    @field_validator("name")
    @classmethod
    def _single_folder_name(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value in ("", ".", "..") or "/" in value or "\\" in value:
            raise ValueError("must be one folder name (no '/', not empty, '.' or '..')")
        if value.startswith("."):
            raise ValueError("must not start with '.' (hidden names are fedge's temporary folders)")
        if not value.isprintable():
            raise ValueError("must not contain control characters")
        if len(value.encode()) > NAME_BYTES:
            raise ValueError(f"is {len(value.encode())} bytes long; at most {NAME_BYTES}")
        return value


class StopConfig(StrictModel):
    """When a run ends before ``rounds`` (``fedge.runner.stop``), and which accuracy levels its summary times.

    ``target_accuracy`` is checked on evaluated rounds; ``max_mb`` (cumulative MB of all links, or a map
    from ``total``, ``up``, ``down``, ``peer`` or a ledger kind to its budget) and ``max_sim_seconds``
    after every round, the round that crosses them being evaluated and kept; ``patience`` ends a run
    whose accuracy has not improved by more than ``min_delta`` over that many evaluations.
    ``on_nonfinite``: a NaN or infinite loss, metric or parameter stops the run (``error``, keeping the last
    good checkpoint) or is recorded and the run goes on (``continue``, for studying divergence).
    """

    target_accuracy: Fraction | None = None
    """stop once an evaluated accuracy reaches this"""
    max_mb: PositiveFloat | dict[str, PositiveFloat] | None = None
    """stop after this many MB of traffic (all links, or a map by direction or ledger kind)"""
    max_sim_seconds: PositiveFloat | None = None
    """stop after this much simulated time"""
    max_epsilon: PositiveFloat | None = None
    """stop before a round that would take the privacy ledger's epsilon past this"""
    patience: PositiveInt | None = None
    """stop after this many evaluations without improvement by more than min_delta"""
    min_delta: Annotated[float, Field(ge=0.0)] = 0.0
    """the improvement patience waits for"""
    targets: list[Fraction] = Field(default_factory=list)
    """accuracy levels whose first round, MB and simulated time the summary reports"""
    on_nonfinite: Literal["error", "continue"] = "error"
    """a NaN or infinite number stops the run (error) or is recorded (continue)"""


class TrackerConfig(StrictModel):
    """One experiment tracker a run reports to (``fedge.tracking``); a plain name is enough."""

    name: Literal["tensorboard", "mlflow", "wandb"]
    """tensorboard, mlflow or wandb"""
    project: str | None = None
    """W&B project / MLflow experiment (default: fedge)"""
    mode: Literal["online", "offline"] | None = None
    """W&B mode (default: its own, WANDB_MODE)"""
    uri: str | None = None
    """MLflow tracking URI (default: its own, MLFLOW_TRACKING_URI)"""


def blocks_by_name(value: Any) -> Any:
    """A list of named blocks as a config may write it: one block, or plain names (``[tensorboard]``)
    for blocks with nothing but a name."""
    if isinstance(value, str | dict):
        value = [value]
    return [{"name": item} if isinstance(item, str) else item for item in value or []]


AggregationSite = Literal["server", "edge", "cloud", "peer", "buffer"]


class StageConfig(StrictModel):
    """One stage of the aggregation pipeline (``fedge.aggregation``): a transform of the received updates
    or the reducer that closes the chain; a plain name is enough."""

    name: str
    """the stage: mean (each site's own) or one registered with fedge.register_stage"""
    at: list[AggregationSite] | None = None
    """the sites it applies at: server, edge, cloud, peer, buffer (default: every site)"""
    options: dict[str, Any] = Field(default_factory=dict)
    """the stage's own keywords"""


class AggregationConfig(StrictModel):
    """What happens to the updates a node receives before they become its new state: an ordered chain
    of stages at every aggregation site; with none, each site takes its own mean, as its paper does."""

    stages: list[StageConfig] = Field(default_factory=list)
    """the stages in order (a reducer, if any, last at each site)"""

    @field_validator("stages", mode="before")
    @classmethod
    def _stages_by_name(cls, value: Any) -> Any:
        return blocks_by_name(value)


class CutDPConfig(StrictModel):
    """Noise at split learning's cut (``privacy.cut``): each sample's smashed data clipped to ``clip``
    and given Gaussian noise of std ``noise_multiplier * clip`` before a client sends it; the cut
    gradient the server returns likewise when ``gradient_clip`` is set."""

    clip: PositiveFloat = 1.0
    """the L2 bound on one sample's smashed data"""
    noise_multiplier: Annotated[float, Field(ge=0.0)] | None = None
    """the smashed data's noise std over clip (unset: calibrated to privacy.target_epsilon)"""
    gradient_clip: PositiveFloat | None = None
    """the L2 bound on one sample's cut gradient (unset: the gradient is sent as computed)"""
    gradient_noise_multiplier: Annotated[float, Field(ge=0.0)] = 0.0
    """the cut gradient's noise std over gradient_clip"""


class LabelDPConfig(StrictModel):
    """Label DP for the labels a split client sends the server (``privacy.labels``): k-ary randomized
    response, each label kept with the probability an ``epsilon``-DP release allows and otherwise drawn
    uniformly over the classes."""

    epsilon: PositiveFloat
    """the label-DP epsilon of one release of a label"""


class PeerDPConfig(StrictModel):
    """DP on every message a peer sends (``privacy.peer``, the decentralized family): the model update a
    peer shares clipped to ``clip`` and given Gaussian noise of std ``noise_multiplier * clip`` once per
    round, whatever number of neighbours receive it."""

    clip: PositiveFloat = 1.0
    """the L2 bound on one peer's shared update"""
    noise_multiplier: Annotated[float, Field(ge=0.0)] | None = None
    """the noise's std over clip (unset: calibrated to privacy.target_epsilon)"""


class SampleDPConfig(StrictModel):
    """DP-SGD in every local step (``privacy.sample``, Abadi et al. 2016): each sample's gradient
    clipped to L2 norm ``clip`` over all trained parameters, the clipped gradients summed, Gaussian
    noise of std ``noise_multiplier * clip`` added, the sum divided by the batch's sample count."""

    clip: PositiveFloat = 1.0
    """the L2 bound on one sample's gradient"""
    noise_multiplier: Annotated[float, Field(ge=0.0)] | None = None
    """the noise's std over clip (unset: calibrated to privacy.target_epsilon)"""


class PrivacyConfig(StrictModel):
    """The privacy ledger and the mechanisms at split learning's cut (``fedge.privacy``); every epsilon
    comes from dp-accounting. A user's aggregation stage records its own releases through the
    ``StageRun`` it is bound to (docs/privacy.md)."""

    delta: Annotated[float, Field(gt=0.0, lt=1.0)] = 1e-5
    """the delta every epsilon is stated at"""
    accountant: Literal["rdp", "pld"] = "rdp"
    """dp-accounting's RDP accountant (every sampling fedge does) or PLD (tighter; no fixed-size draws)"""
    target_epsilon: PositiveFloat | None = None
    """calibrate every noise multiplier left unset so that the whole run spends this epsilon"""
    participation: Literal["fixed", "poisson"] = "fixed"
    """how a star round draws its clients: a fixed number without replacement, or each independently
    with probability algorithm.fraction (Poisson, the sampling client-level DP-FedAvg accounts best)"""
    sample: SampleDPConfig | None = None
    """DP-SGD in every local step"""
    cut: CutDPConfig | None = None
    """noise on split learning's smashed data (and cut gradients)"""
    labels: LabelDPConfig | None = None
    """randomized response on the labels split clients send"""
    peer: PeerDPConfig | None = None
    """clipping and noise on every message a peer sends"""


CUT_ATTACKS = ("smashed_noise", "smashed_flip")
"""The split family's attacks on the smashed data a malicious client sends across the cut."""
STAR_ATTACKS = ("backdoor",)
"""The attacks whose evaluation adds a success rate (a backdoor: its data view and its success rate)."""
ATTACKS: tuple[str, ...] = ("sign_flip", "scaling", "gaussian", "free_rider", "alie", "ipm", "label_flip")
ATTACKS += ("min_max", "min_sum", *STAR_ATTACKS, *CUT_ATTACKS)
"""The adversary's attacks (``fedge.adversary``): model poisoning of the uploaded rows, data poisoning
(flipped labels, a backdoor trigger), or (split learning) poisoned smashed data."""
ATTACK_OPTIONS: dict[str, tuple[str, ...]] = {
    "sign_flip": ("scale",),
    "scaling": ("scale",),
    "gaussian": ("sigma",),
    "free_rider": (),
    "alie": ("z",),
    "ipm": ("epsilon",),
    "label_flip": (),
    "smashed_noise": ("sigma",),
    "smashed_flip": ("scale",),
    "backdoor": ("target", "trigger_size", "poison_fraction", "scale"),
    "min_max": ("perturbation", "gamma_init", "tolerance"),
    "min_sum": ("perturbation", "gamma_init", "tolerance"),
}
"""Each attack's options (numbers: ``z`` any real, ``target`` a non-negative integer, ``trigger_size`` a
positive integer, ``poison_fraction`` in (0, 1], the others positive; ``perturbation`` a name)."""
PERTURBATIONS = ("std", "unit", "sign")
"""min-max's and min-sum's perturbation directions (Shejwalkar and Houmansadr 2021)."""
PEER_ADVERSARY_ALGORITHMS = ("afind", "gossip", "pens", "federico", "local", "ditto", "fedfomo", "dispfl")
"""The decentralized algorithms that take an ``adversary`` block (malicious peers poison what they send)."""
PROBING_ALGORITHMS = ("afind", "pens", "federico")
"""The peer selectors a malicious peer answers probes of (``adversary.probes``)."""
SPLIT_ADVERSARY_ALGORITHMS = ("cse_fsl", "splitfed_v1", "splitfed_v2", "fsl_an", "fsl_sage")
"""The split algorithms that take an ``adversary`` block (its attacks at the cut and on the client models)."""
FEDSL_ADVERSARY_ALGORITHMS = ("light_fedsl", "fedsl")
"""Lightweight FedSL and FedSL: the split attacks but the backdoor, in simulation only (not deployed)."""
ADVERSARY_ALGORITHMS = (
    "fedavg",
    "fedavg_ft",
    *PEER_ADVERSARY_ALGORITHMS,
    "hist",
    "hfedavg",
    "fedbuff",
    "fedasync",
    "fedavg_deadline",
    *SPLIT_ADVERSARY_ALGORITHMS,
    *FEDSL_ADVERSARY_ALGORITHMS,
)
"""The algorithms that take an ``adversary`` block (the star family's server, the peers, a hierarchy's
edges, an asynchronous server's buffer, a deadline round's received rows, the split family's server)."""


class AdversaryConfig(StrictModel):
    """Clients that lie (``fedge.adversary``): which clients (and, in a hierarchy, which edge servers)
    are malicious, from which round, and how they attack: by model poisoning of the rows they upload, or
    by training on flipped labels or a backdoor trigger."""

    clients: float | list[int] | None = None
    """the malicious clients: a fraction in (0, 1) drawn once from the run seed, or a list of client ids
    (HIST, HFedAvg: may be left out where adversary.edges names malicious edge servers)"""
    edges: float | list[int] | None = None
    """HIST, HFedAvg: malicious edge servers that poison their upload to the cloud, a fraction in (0, 1)
    of the cells drawn once from the run seed, or a list of edge ids (default: none)"""
    start_round: PositiveInt = 1
    """the first round they attack (before it they behave honestly)"""
    attack: Literal[ATTACKS]  # type: ignore[valid-type]
    """sign_flip, scaling, gaussian, free_rider, alie, ipm, label_flip, min_max, min_sum; backdoor;
    split: smashed_noise, smashed_flip (docs/robustness.md)"""
    options: dict[str, Any] = Field(default_factory=dict)
    """the attack's own options: scale (sign_flip, scaling, backdoor, smashed_flip), sigma (gaussian,
    smashed_noise), z (alie), epsilon (ipm), target, trigger_size, poison_fraction (backdoor),
    perturbation, gamma_init, tolerance (min_max, min_sum)"""
    probes: Literal["honest", "poisoned"] = "honest"
    """peers only: a malicious peer answers a selector's probes honestly (poisoning only the models it
    sends once selected) or poisons them too (AFIND+, PENS, FedeRiCo)"""

    @field_validator("clients", "edges", mode="before")
    @classmethod
    def _fraction_or_ids(cls, value: Any) -> Any:
        if value is None:  # left out (a resolved config writes it as null)
            return value
        fraction = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1
        ids = isinstance(value, list) and all(type(i) is int and i >= 0 for i in value)
        if not fraction and not (ids and value and len(set(value)) == len(value)):
            raise ValueError("must be a fraction in (0, 1) or a non-empty list of distinct ids")
        return value

    @model_validator(mode="after")
    def _known_options(self) -> AdversaryConfig:
        known = ATTACK_OPTIONS[self.attack]
        for option, value in self.options.items():
            key = f"adversary.options.{option}"
            if option not in known:
                takes = f"takes {', '.join(known)}" if known else "takes no options"
                raise ConfigError(key, f"{self.attack} has no option {option!r}; it {takes}")
            if option == "perturbation":
                if value not in PERTURBATIONS:
                    raise ConfigError(key, f"must be one of {', '.join(PERTURBATIONS)} (got {_shown(value)})")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(key, f"must be a finite number (got {_shown(value)})")
            if option in ("target", "trigger_size") and value != int(value):
                raise ConfigError(key, f"must be an integer (got {_shown(value)})")
            if option == "target" and value < 0:
                raise ConfigError(key, f"must be a class, 0 or more (got {_shown(value)})")
            if option == "poison_fraction" and not 0 < value <= 1:
                raise ConfigError(key, f"must be a fraction in (0, 1] (got {_shown(value)})")
            if option not in ("z", "target") and value <= 0:
                raise ConfigError(key, f"must be positive (got {_shown(value)})")
        return self


class RunConfig(StrictModel):
    """Everything that defines a run."""

    seed: int = 0
    """the run seed: every random stream (data, partition, init, sampling, batches) derives from it"""
    rounds: PositiveInt = 30
    """global rounds to run (a stop rule may end the run earlier)"""
    data: DataConfig = Field(default_factory=DataConfig)
    """which dataset and how much of it"""
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    """how the training set is divided among clients"""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """the model, where split learning cuts it, and its auxiliary head"""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """the local training loss"""
    algorithm: SerializeAsAny[AlgorithmConfig] = Field(
        default_factory=lambda: {"name": DEFAULT_ALGORITHM}, validate_default=True
    )
    """the algorithm (by name) and its knobs: `fedge list --algorithm NAME`"""
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    """the stages between the updates a node receives and its new state"""
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    """the privacy ledger's delta and accountant, and the client-step mechanisms"""
    adversary: AdversaryConfig | None = None
    """malicious clients and their attack (default: none, every client honest)"""
    system: SystemConfig = Field(default_factory=SystemConfig)
    """the wireless system and compute model behind the simulated clock"""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """where and how local training runs (executor, device, threads)"""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """when and in what batches the model is evaluated"""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """the results directory and what goes in it"""
    stop: StopConfig = Field(default_factory=StopConfig)
    """rules that end a run early, and accuracy targets to time"""
    tracking: list[TrackerConfig] = Field(default_factory=list)
    """experiment trackers to report to (tensorboard, mlflow, wandb)"""

    @field_validator("tracking", mode="before")
    @classmethod
    def _trackers_by_name(cls, value: Any) -> Any:
        return blocks_by_name(value)

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_by_name(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, AlgorithmConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError("must be a block with a 'name' (see `fedge list`)")
        value = {"name": DEFAULT_ALGORITHM, **value}
        names = (info.context or {}).get("algorithms")
        known = AlgorithmConfig.registry if names is None else dict.fromkeys(names)
        if value["name"] not in known:
            name = value["name"]
            near = difflib.get_close_matches(str(name), known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}"
            raise ValueError(f"unknown algorithm {name!r}; {hint}")
        if names is not None:  # checked before the algorithms' classes are imported
            block = (info.context or {}).get("blocks", {}).get(value["name"])
            if block is not None:
                block.model_validate(value)
            return AlgorithmConfig.model_construct(name=value["name"])
        return known[value["name"]].model_validate(value)

    @model_validator(mode="after")
    def _adversary_fits(self) -> RunConfig:
        """An adversary only where it is built (:data:`ADVERSARY_ALGORITHMS`), with ids among the clients."""
        if self.adversary is None:
            return self
        if self.algorithm.name not in ADVERSARY_ALGORITHMS:
            known = ", ".join(ADVERSARY_ALGORITHMS)
            raise ConfigError("adversary", f"is built for {known}, not {self.algorithm.name} (yet)")
        if self.adversary.probes != "honest" and self.algorithm.name not in PROBING_ALGORITHMS:
            probing = ", ".join(PROBING_ALGORITHMS)
            raise ConfigError("adversary.probes", f"only {probing} probe peers, not {self.algorithm.name}")
        attack, name = self.adversary.attack, self.algorithm.name
        if attack in CUT_ATTACKS and name not in (*SPLIT_ADVERSARY_ALGORITHMS, *FEDSL_ADVERSARY_ALGORITHMS):
            raise ConfigError("adversary.attack", f"{attack} poisons split smashed data; {name} has none")
        if attack in STAR_ATTACKS and name in FEDSL_ADVERSARY_ALGORITHMS:
            why = "its batches index the run's samples, not a backdoor's stamped copies"
            raise ConfigError("adversary.attack", f"{attack} is not built for {name}: {why}")
        if attack in STAR_ATTACKS and name not in BACKDOOR_ALGORITHMS:
            built = ", ".join(BACKDOOR_ALGORITHMS)
            raise ConfigError("adversary.attack", f"{attack} is built for {built}, not {name} (yet)")
        if name == "dispfl" and attack in OMNISCIENT_ATTACKS:
            sparse = "Dis-PFL's personal masks give peers no honest values of the same coordinates"
            raise ConfigError("adversary.attack", f"{attack} reads honest rows' coordinates; {sparse}")
        _edges_fit(self.adversary, name)
        ids = self.adversary.clients
        if isinstance(ids, list) and max(ids) >= self.partition.num_clients:
            beyond = f"client {max(ids)} is not among the {self.partition.num_clients} clients"
            raise ConfigError("adversary.clients", beyond)
        return self

    def to_yaml(self) -> str:
        """The resolved config as YAML (paths as strings)."""
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True), sort_keys=False)


BACKDOOR_ALGORITHMS = (
    "fedavg",
    "fedavg_ft",
    "hist",
    "hfedavg",
    "gossip",
    "afind",
    "pens",
    "federico",
    "local",
    "ditto",
    "fedbuff",
    "fedasync",
    "fedavg_deadline",
    *SPLIT_ADVERSARY_ALGORITHMS,
)
"""The algorithms whose malicious clients can train a backdoor and whose evaluation reports its success."""
EDGE_ADVERSARY_ALGORITHMS = ("hist", "hfedavg")
"""The algorithms whose edge servers can be malicious (``adversary.edges``)."""
OMNISCIENT_ATTACKS = ("alie", "ipm", "min_max", "min_sum")
"""The attacks that read the honest rows of the same coordinates."""


def _edges_fit(adversary: AdversaryConfig, name: str) -> None:
    """Malicious edges only in a hierarchy, poisoning the model they upload (an edge trains on no data);
    malicious clients named unless edges are; HIST's disjoint submodels give the omniscient attacks no
    honest values of a malicious edge's slots."""
    if adversary.edges is None:
        if adversary.clients is None:
            raise ConfigError("adversary.clients", "name the malicious clients (a fraction or a list of ids)")
        return
    if name not in EDGE_ADVERSARY_ALGORITHMS:
        raise ConfigError("adversary.edges", f"edge servers are built for hist and hfedavg, not {name}")
    if adversary.attack in ("label_flip", *STAR_ATTACKS, *CUT_ATTACKS):
        raise ConfigError(
            "adversary.attack",
            f"{adversary.attack} poisons training data; a malicious edge poisons its model",
        )
    if name == "hist" and adversary.attack in OMNISCIENT_ATTACKS:
        raise ConfigError(
            "adversary.attack",
            f"{adversary.attack} reads the honest edges' values of the same coordinates; HIST's edges hold "
            "disjoint neurons (use hfedavg or a per-row attack)",
        )


def _block_model(annotation: Any) -> type[BaseModel] | None:
    """The config block class inside a field's annotation (``AuxConfig | None`` -> ``AuxConfig``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _block_model(arg)
        if found is not None:
            return found
    return None


def _keys_at(
    raw: dict[str, Any], path: tuple[Any, ...], blocks: dict[str, type[BaseModel]] | None = None
) -> list[str]:
    """The valid keys of the block at ``path`` (the algorithm block by the name ``raw`` gives it, from
    ``blocks`` where the algorithms' classes are not loaded)."""
    block: type[BaseModel] | None = RunConfig
    node: Any = raw
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
        if block is RunConfig and part == "algorithm":
            name = node.get("name", DEFAULT_ALGORITHM) if isinstance(node, dict) else DEFAULT_ALGORITHM
            block = AlgorithmConfig.registry.get(name) or (blocks or {}).get(name)
        else:
            field = block.model_fields.get(str(part)) if block is not None else None
            block = _block_model(field.annotation) if field is not None else None
        if block is None:
            return []
    return config_keys(block)


def _unknown_key(
    raw: dict[str, Any], loc: tuple[Any, ...], blocks: dict[str, type[BaseModel]] | None = None
) -> str:
    """``unknown key``, with the nearest valid key of that block (or the valid keys) as a hint."""
    known = _keys_at(raw, loc[:-1], blocks)
    if str(loc[-1]) in known:
        return "set twice (under two spellings of one key, such as a descriptive name and its symbol)"
    near = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if near:
        return f"unknown key; did you mean {near[0]!r}?"
    return f"unknown key; valid keys here: {', '.join(known)}" if known else "unknown key"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_error(
    error: ValidationError, raw: dict[str, Any], blocks: dict[str, type[BaseModel]] | None = None
) -> ConfigError:
    """One line naming the offending key, from pydantic's error list."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "config"
    message = first["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if first["type"] == "extra_forbidden":
        message = _unknown_key(raw, first["loc"], blocks)
    elif "got " in message:
        pass
    elif "input" in first and first["type"] != "missing" and not isinstance(first["input"], dict):
        message = f"{message} (got {_shown(first['input'])})"
    return ConfigError(key, message)


def parse_config(raw: dict[str, Any], names: dict[str, Any] | None = None) -> RunConfig:
    """Validate a nested dict into a :class:`RunConfig` against the registered algorithms and datasets,
    raising :class:`ConfigError` (:func:`fedge.extend.parse_config` registers installed plugins first).

    With ``names`` (``{"algorithms": ..., "datasets": ..., "blocks": ...}``), a check that needs no
    algorithm class: the algorithm is known by those names, its block is checked against ``blocks`` (a
    stand-in block class by algorithm name; one without is left for the full parse), and the datasets
    are admitted besides the registered ones (:mod:`fedge.intake.precheck`).
    """
    if not isinstance(raw, dict):
        raise ConfigError("config", "must be a mapping of keys")
    try:
        return RunConfig.model_validate(raw, context=names)
    except ValidationError as error:
        raise _first_error(error, raw, (names or {}).get("blocks")) from None


class _Loader(yaml.SafeLoader):
    """YAML's safe loader that also reads ``1e12`` and ``1.5e3`` (YAML 1.1 wants a dot and a signed
    exponent) as numbers."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def split_values(text: str) -> list[str]:
    """``v1,v2,...`` split on the commas outside brackets (so ``[1,2],[3]`` is two values)."""
    values, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{("
        depth -= char in "]})"
        if char == "," and depth == 0:
            values.append(current)
            current = ""
        else:
            current += char
    values.append(current)
    return [v.strip() for v in values if v.strip()]


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override to a nested dict in place (value parsed as YAML)."""
    if "=" not in assignment:
        raise ConfigError(assignment, "override must look like key=value")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(key, "override key has an empty part")
    try:
        value = _yaml(text)
    except yaml.YAMLError:
        value = text
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is not a block; cannot set a key inside it")
        node = child
    node[parts[-1]] = value


MAX_CONFIG_BYTES = 2**20


def _read_text(path: Path) -> str:
    """The UTF-8 text of a config file (a UTF-8 byte-order mark is allowed), at most 1 MiB."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(str(path), f"cannot read config file ({error.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(str(path), "is larger than 1 MiB: not a config file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(str(path), f"is not UTF-8 text (byte {error.start}); save it as UTF-8") from None


def load_raw(path: Path | None) -> dict[str, Any]:
    """Read a YAML config file into a dict (an empty dict for ``None``)."""
    if path is None:
        return {}
    text = _read_text(Path(path))
    try:
        raw = _yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(str(path), f"not valid YAML{where}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "a config file must hold a mapping of keys")
    return raw


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults) and apply dotted overrides."""
    raw = load_raw(path)
    for assignment in overrides or []:
        apply_override(raw, assignment)
    return parse_config(raw)


def _number(value: Any) -> Any:
    """A bound as it reads best: ``0`` for ``0.0`` (pydantic may hand back either spelling of one bound)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _type_name(annotation: Any) -> str:
    """A short readable type: ``int > 0``, ``'sgd' | 'adam'``, ``float | none``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        bounds = [
            f"{symbol} {_number(getattr(meta, attr))}"
            for meta in extra
            for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
            if getattr(meta, attr, None) is not None
        ]
        return " ".join([_type_name(base), *bounds])
    if origin is Literal:
        return " | ".join(repr(arg) for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in get_args(annotation))
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(_type_name(arg) for arg in get_args(annotation))}]"
    if annotation is type(None):
        return "none"
    return getattr(annotation, "__name__", str(annotation))


def describe_fields(
    block: type[BaseModel], prefix: str = "", defaults: BaseModel | None = None
) -> list[dict[str, Any]]:
    """Every key of a config block (nested blocks flattened to dotted keys): its type, default, other
    spellings and description, for ``fedge list --algorithm``. ``defaults``: the enclosing block's default
    for this one (AFIND+'s optimizer defaults differ from the optimizer block's own)."""
    rows = []
    for name, field in block.model_fields.items():
        key = prefix + (field.serialization_alias or name)
        if defaults is not None:
            default = getattr(defaults, name)
        else:
            default = None if field.is_required() else field.get_default(call_default_factory=True)
        nested = _block_model(field.annotation)
        if nested is not None and isinstance(default, nested):
            rows.extend(describe_fields(nested, key + ".", default))
            continue
        choices = field.validation_alias.choices if isinstance(field.validation_alias, AliasChoices) else []
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        rows.append(
            {
                "key": key,
                "type": _type_name(
                    field.metadata and Annotated[(field.annotation, *field.metadata)] or field.annotation
                ),
                "default": default,
                "aliases": [str(c) for c in choices if str(c) != key.rsplit(".", 1)[-1]],
                "description": field.description or "",
            }
        )
    return rows


def _other_spellings(schema: dict[str, Any], block: type[BaseModel]) -> None:
    """Add to a block's schema the keys its fields also accept (the papers' symbols)."""
    properties = schema.get("properties", {})
    for name, field in block.model_fields.items():
        if isinstance(field.validation_alias, AliasChoices):
            key = field.serialization_alias or name
            for other in map(str, field.validation_alias.choices):
                properties.setdefault(other, {**properties[key], "description": f"another spelling of {key}"})


def _blocks(block: type[BaseModel]) -> list[type[BaseModel]]:
    """``block`` and every config block nested in it."""
    found = [block]
    for field in block.model_fields.values():
        nested = _block_model(field.annotation)
        if nested is not None and nested not in found:
            found.extend(b for b in _blocks(nested) if b not in found)
    return found


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a run config, with ``algorithm`` one of every registered algorithm's block."""
    schema = RunConfig.model_json_schema(by_alias=True)
    defs = schema.setdefault("$defs", {})
    choices = []
    for name, block in sorted(AlgorithmConfig.registry.items()):
        sub = block.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        nested = sub.pop("$defs", {})
        for inner in _blocks(block)[1:]:
            _other_spellings(nested.get(inner.__name__, {}), inner)
        _other_spellings(sub, block)
        defs.update(nested)
        title = f"algorithm:{name}"
        defs[title] = sub
        choices.append({"$ref": f"#/$defs/{title}"})
    schema["properties"]["algorithm"] = {"description": "the algorithm and its knobs", "anyOf": choices}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
