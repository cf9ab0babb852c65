"""Run configuration as data: pydantic v2 models, YAML loading and dotted ``key=value`` overrides.

A run is fully described by one :class:`RunConfig`. Unknown keys and impossible values are rejected
with a :class:`~fedge.errors.ConfigError` whose one-line message names the key. Checks that need the
data or the model (more clients than samples, a cut beyond the model's depth) happen when the run is
built, and raise the same error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

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


class StrictModel(BaseModel):
    """Base of every config block: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    threads: PositiveInt | None = None
    compile: bool = False  # torch.compile the batched executor's step (first rounds pay compilation)
    retain_memory: bool = True  # on CPU, keep freed memory for reuse (fedge.engine.host)


class SystemConfig(StrictModel):
    """Wireless system model; defaults are lightweight FedSL's Sec. IV values (5 MHz, 23/37 dBm,
    -174 dBm/Hz, 100-300 m). Fading and the compute/energy model are our completion of the papers (they
    give none): placeholder device and server speeds, kappa = 1e-28 (docs/decisions.md, "Platform").
    """

    bandwidth_hz: Annotated[float, Field(gt=0.0)] = 5e6
    client_power_dbm: float = 23.0
    server_power_dbm: float = 37.0
    noise_dbm_per_hz: float = -174.0
    distance_min_m: Annotated[float, Field(gt=0.0)] = 100.0
    distance_max_m: Annotated[float, Field(gt=0.0)] = 300.0
    distances: Literal["uniform", "linspace"] = "uniform"
    fading: Literal["none", "rayleigh"] = "none"
    client_cpu_hz: Annotated[float, Field(gt=0.0)] = 1e9
    server_cpu_hz: Annotated[float, Field(gt=0.0)] = 1e11
    cycles_per_flop: Annotated[float, Field(gt=0.0)] = 1.0
    kappa: Annotated[float, Field(ge=0.0)] = 1e-28

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
    """The results directory ``dir/name`` and what goes in it."""

    dir: Path = Path("runs")
    name: str | None = None
    checkpoint_every: PositiveInt = 1
    plots: bool = True


class StopConfig(StrictModel):
    """When a run ends before ``rounds`` (``fedge.stop``), and which accuracy levels its summary times.

    ``target_accuracy`` is checked on evaluated rounds; ``max_mb`` (cumulative MB of all links, or a map
    from ``total``, ``up``, ``down``, ``peer`` or a ledger kind to its budget) and ``max_sim_seconds``
    after every round, the round that crosses them being evaluated and kept; ``patience`` ends a run
    whose accuracy has not improved by more than ``min_delta`` over that many evaluations.
    """

    target_accuracy: Fraction | None = None
    max_mb: PositiveFloat | dict[str, PositiveFloat] | None = None
    max_sim_seconds: PositiveFloat | None = None
    patience: PositiveInt | None = None
    min_delta: Annotated[float, Field(ge=0.0)] = 0.0
    targets: list[Fraction] = Field(default_factory=list)


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
            raise ValueError(f"unknown algorithm {value['name']!r}; known: {', '.join(sorted(known))}")
        return known[value["name"]].model_validate(value)

    def to_yaml(self) -> str:
        """The resolved config as YAML (paths as strings)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _first_error(error: ValidationError) -> ConfigError:
    """One line naming the offending key, from pydantic's error list."""
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"]) or "config"
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif "input" in first and first["type"] != "missing" and not isinstance(first["input"], dict):
        message = f"{message} (got {first['input']!r})"
    return ConfigError(key, message)


def parse_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a nested dict into a :class:`RunConfig`, raising :class:`ConfigError`."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as error:
        raise _first_error(error) from None


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` override to a nested dict in place (value parsed as YAML)."""
    if "=" not in assignment:
        raise ConfigError(assignment, "override must look like key=value")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(key, "override key has an empty part")
    try:
        value = yaml.safe_load(text)
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


def load_raw(path: Path | None) -> dict[str, Any]:
    """Read a YAML config file into a dict (an empty dict for ``None``)."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(str(path), f"cannot read config file ({error.strerror})") from None
    try:
        raw = yaml.safe_load(text)
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
