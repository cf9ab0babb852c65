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
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from fedge.errors import ConfigError

Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
DATASETS = ("digits", "synthetic", "mnist", "fashion-mnist", "cifar10", "cifar100", "femnist")
DEFAULT_ALGORITHM = "fedavg"
PARTITIONERS = ("iid", "dirichlet", "pathological", "shards", "natural", "grouped")
INT64_MAX = 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38  # config numbers end up in float32 tensors
NAME_BYTES = 200  # longest run name: room for the "-N" suffix and the hidden staging name within 255


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


class StrictModel(BaseModel):
    """Base of every config block: unknown keys are errors, assignments are validated, and numbers must be
    finite (``allow_inf_nan=False``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

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

    name: Literal[DATASETS] = "digits"  # type: ignore[valid-type]
    root: Path | None = None
    download: bool = False
    train_limit: PositiveInt | None = None
    test_limit: PositiveInt | None = None
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    num_train: PositiveInt = 2000
    num_test: PositiveInt = 500
    num_classes: Annotated[int, Field(ge=2)] = 10
    shape: list[PositiveInt] = Field(default_factory=lambda: [1, 8, 8], min_length=1, max_length=3)
    crop: PositiveInt | None = None  # centre crop of images to crop x crop (CSE-FSL's 24x24 CIFAR input)


class PartitionConfig(StrictModel):
    """How training samples are divided among clients, and the size of each client's test set."""

    kind: Literal[PARTITIONERS] = "dirichlet"  # type: ignore[valid-type]
    num_clients: PositiveInt = 10
    alpha: Annotated[float, Field(gt=0.0)] = 0.5
    min_size: Annotated[int, Field(ge=1)] = 10
    max_retries: PositiveInt = 100
    classes_per_client: PositiveInt = 2
    shards_per_client: PositiveInt = 2
    num_groups: PositiveInt = 4
    test_size: PositiveInt | None = None


class AuxConfig(StrictModel):
    """A client-side auxiliary head (split learning with local loss)."""

    kind: Literal["linear", "mlp", "cnn_mlp"] = "linear"
    channels: PositiveInt | None = None
    hidden: PositiveInt | None = None


class ModelConfig(StrictModel):
    """A splittable model from the zoo, where to cut it, and builder options."""

    name: str = "mlp"
    cut: PositiveInt | None = None
    aux: AuxConfig | None = None
    options: dict[str, Any] = Field(default_factory=dict)


class SGDConfig(StrictModel):
    """Plain SGD with (optional) momentum and weight decay, PyTorch semantics."""

    lr: Annotated[float, Field(gt=0.0)] = 0.05
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.0


class AlgorithmConfig(StrictModel):
    """Base of every algorithm's own config; ``name`` picks the registered algorithm."""

    name: str
    registry: ClassVar[dict[str, type[AlgorithmConfig]]] = {}


def register_algorithm_config(name: str):
    """Class decorator: make ``cls`` the config class of algorithm ``name``."""

    def wrap(cls: type[AlgorithmConfig]) -> type[AlgorithmConfig]:
        AlgorithmConfig.registry[name] = cls
        return cls

    return wrap


class EngineConfig(StrictModel):
    """Where and how local training runs."""

    executor: Literal["sequential", "batched"] = "batched"
    device: str = "cpu"
    threads: Annotated[int, Field(ge=1, le=1024)] | None = None
    compile: bool = False  # torch.compile the batched executor's step (first rounds pay compilation)
    retain_memory: bool = True  # on CPU, keep freed memory for reuse (fedge.engine.host)
    # seconds a collective waits for the other ranks of a torchrun-launched run (docs/scale-out.md)
    dist_timeout: Annotated[float, Field(gt=0.0, le=86400.0)] = 300.0


class SystemConfig(StrictModel):
    """Wireless system model; defaults are lightweight FedSL's Sec. IV values (5 MHz, 23/37 dBm,
    -174 dBm/Hz, 100-300 m). Fading and the compute/energy model are our completion of the papers (they
    give none): placeholder device and server speeds, kappa = 1e-28 (docs/decisions.md, "Platform").

    Every value is bounded far beyond any radio or processor (1 Hz to 1 THz, -100 to 100 dBm, 1 m to
    10,000 km, up to 1 PHz) so that rates, times and energies stay finite numbers.
    """

    bandwidth_hz: Annotated[float, Field(ge=1.0, le=1e12)] = 5e6
    client_power_dbm: Annotated[float, Field(ge=-100.0, le=100.0)] = 23.0
    server_power_dbm: Annotated[float, Field(ge=-100.0, le=100.0)] = 37.0
    noise_dbm_per_hz: Annotated[float, Field(ge=-300.0, le=0.0)] = -174.0
    distance_min_m: Annotated[float, Field(ge=1.0, le=1e7)] = 100.0
    distance_max_m: Annotated[float, Field(ge=1.0, le=1e7, validate_default=True)] = 300.0
    distances: Literal["uniform", "linspace"] = "uniform"
    fading: Literal["none", "rayleigh"] = "none"
    client_cpu_hz: Annotated[float, Field(ge=1.0, le=1e15)] = 1e9
    server_cpu_hz: Annotated[float, Field(ge=1.0, le=1e15)] = 1e11
    cycles_per_flop: Annotated[float, Field(gt=0.0, le=1e9)] = 1.0
    kappa: Annotated[float, Field(ge=0.0, le=1.0)] = 1e-28

    @field_validator("distance_max_m")
    @classmethod
    def _distance_range(cls, value: float, info: ValidationInfo) -> float:
        if value < info.data.get("distance_min_m", 0.0):
            raise ValueError("must be >= system.distance_min_m")
        return value


class EvalConfig(StrictModel):
    """Evaluation schedule: every ``every`` rounds and always after the last round."""

    every: PositiveInt = 1
    batch_size: PositiveInt = 2048


class OutputConfig(StrictModel):
    """The results directory ``dir/name`` and what goes in it. ``name`` is one folder name."""

    dir: Path = Path("runs")
    name: str | None = None
    checkpoint_every: PositiveInt = 1
    plots: bool = True

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
    """When a run ends before ``rounds`` (``fedge.stop``), and which accuracy levels its summary times.

    ``target_accuracy`` is checked on evaluated rounds; ``max_mb`` (cumulative MB of all links, or a map
    from ``total``, ``up``, ``down``, ``peer`` or a ledger kind to its budget) and ``max_sim_seconds``
    after every round, the round that crosses them being evaluated and kept; ``patience`` ends a run
    whose accuracy has not improved by more than ``min_delta`` over that many evaluations.
    ``on_nonfinite``: a NaN or infinite loss, metric or parameter stops the run (``error``, keeping the last
    good checkpoint) or is recorded and the run goes on (``continue``, for studying divergence).
    """

    target_accuracy: Fraction | None = None
    max_mb: PositiveFloat | dict[str, PositiveFloat] | None = None
    max_sim_seconds: PositiveFloat | None = None
    patience: PositiveInt | None = None
    min_delta: Annotated[float, Field(ge=0.0)] = 0.0
    targets: list[Fraction] = Field(default_factory=list)
    on_nonfinite: Literal["error", "continue"] = "error"


class TrackerConfig(StrictModel):
    """One experiment tracker a run reports to (``fedge.tracking``); a plain name is enough."""

    name: Literal["tensorboard", "mlflow", "wandb"]
    project: str | None = None  # W&B project / MLflow experiment (default: "fedge")
    mode: Literal["online", "offline"] | None = None  # W&B (default: its own, WANDB_MODE)
    uri: str | None = None  # MLflow tracking URI (default: its own, MLFLOW_TRACKING_URI)


class RunConfig(StrictModel):
    """Everything that defines a run."""

    seed: int = 0
    rounds: PositiveInt = 30
    data: DataConfig = Field(default_factory=DataConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: SerializeAsAny[AlgorithmConfig] = Field(
        default_factory=lambda: {"name": DEFAULT_ALGORITHM}, validate_default=True
    )
    system: SystemConfig = Field(default_factory=SystemConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    tracking: list[TrackerConfig] = Field(default_factory=list)

    @field_validator("tracking", mode="before")
    @classmethod
    def _trackers_by_name(cls, value: Any) -> Any:
        if isinstance(value, str | dict):
            value = [value]
        return [{"name": item} if isinstance(item, str) else item for item in value or []]

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_by_name(cls, value: Any) -> Any:
        if isinstance(value, AlgorithmConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError("must be a block with a 'name' (see `fedge list`)")
        value = {"name": DEFAULT_ALGORITHM, **value}
        known = AlgorithmConfig.registry
        if value["name"] not in known:
            name = value["name"]
            near = difflib.get_close_matches(str(name), known, n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}"
            raise ValueError(f"unknown algorithm {name!r}; {hint}")
        return known[value["name"]].model_validate(value)

    def to_yaml(self) -> str:
        """The resolved config as YAML (paths as strings)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _block_model(annotation: Any) -> type[BaseModel] | None:
    """The config block class inside a field's annotation (``AuxConfig | None`` -> ``AuxConfig``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _block_model(arg)
        if found is not None:
            return found
    return None


def _keys_at(raw: dict[str, Any], path: tuple[Any, ...]) -> list[str]:
    """The valid keys of the block at ``path`` (the algorithm block by the name ``raw`` gives it)."""
    block: type[BaseModel] | None = RunConfig
    node: Any = raw
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
        if block is RunConfig and part == "algorithm":
            name = node.get("name", DEFAULT_ALGORITHM) if isinstance(node, dict) else DEFAULT_ALGORITHM
            block = AlgorithmConfig.registry.get(name)
        else:
            field = block.model_fields.get(str(part)) if block is not None else None
            block = _block_model(field.annotation) if field is not None else None
        if block is None:
            return []
    return list(block.model_fields)


def _unknown_key(raw: dict[str, Any], loc: tuple[Any, ...]) -> str:
    """``unknown key``, with the nearest valid key of that block (or the valid keys) as a hint."""
    known = _keys_at(raw, loc[:-1])
    near = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if near:
        return f"unknown key; did you mean {near[0]!r}?"
    return f"unknown key; valid keys here: {', '.join(known)}" if known else "unknown key"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _first_error(error: ValidationError, raw: dict[str, Any]) -> ConfigError:
    """One line naming the offending key, from pydantic's error list."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "config"
    message = first["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if first["type"] == "extra_forbidden":
        message = _unknown_key(raw, first["loc"])
    elif "got " in message:
        pass
    elif "input" in first and first["type"] != "missing" and not isinstance(first["input"], dict):
        message = f"{message} (got {_shown(first['input'])})"
    return ConfigError(key, message)


def parse_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a nested dict into a :class:`RunConfig`, raising :class:`ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError("config", "must be a mapping of keys")
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as error:
        raise _first_error(error, raw) from None


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
