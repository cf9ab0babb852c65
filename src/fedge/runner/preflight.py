"""Memory pre-flight: refuse, before anything large is allocated, a run the machine cannot hold.

The estimate is rough on purpose (float32 values, 4 bytes each) and errs high:

- first, from the config alone (before any data is generated, loaded or partitioned): a synthetic set,
  and wherever the dataset's shape is known (synthetic or built in) the model, every client's model and
  the least batch plan any partition can give -- so ten million clients are refused in a second, not
  after minutes of drawing and partitioning;
- the data: a synthetic set from its config, before it is drawn; any other set as loaded;
- the model: parameters and buffers counted on the meta device (nothing allocated; a pretrained
  checkpoint's sizes from its config, no weights read), held as the global
  model, its gradient and the optimizer's slots (one for momentum); a transformer's frozen base (the
  tensors outside its trained state under LoRA) once, whatever the number of clients;
- the clients: every client's model stacked, with its optimizer slots;
- the largest batch: the batch plan (``[clients, steps, batch]`` int64 indices and float32 weights);
- once the model is known to fit and is built: the activations of the training batches of the clients
  that train at once (one for the sequential executor, a chunk for the batched one; per-sample outputs
  of every layer, times three for the forward values, their gradients and slack) and of one evaluation
  batch.

The sum is compared with the memory available now: ``MemAvailable`` of ``/proc/meminfo``, lowered to the
cgroup's limit where one is set, or the free memory of the CUDA device. A run that needs more is a
:class:`~fedge.errors.ConfigError` naming the largest part and both figures; ``force`` skips the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedge.config import RunConfig
from fedge.data.federated import FederatedData
from fedge.errors import ConfigError
from fedge.models import build_model
from fedge.models.transformer import frozen_values, sizes_only

FLOAT_BYTES = 4
PLAN_BYTES = 8 + 4  # an int64 sample index and a float32 weight per batch entry
ACTIVATION_FACTOR = 3
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
SHAPES = {  # sample shape and classes of the built-in sets read from files (before any crop)
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "femnist": ((1, 28, 28), 62),
}


@dataclass(frozen=True)
class Part:
    """One line of the estimate: the config key that sets it, its size in bytes, and what it is."""

    key: str
    bytes: int
    what: str


def human(size: float) -> str:
    """Bytes in binary units, e.g. ``'7.3 TiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _cgroup_room() -> int | None:
    """Bytes the cgroup (v2) still allows this process, if it sets a limit."""
    try:
        limit = (CGROUP / "memory.max").read_text().strip()
        used = int((CGROUP / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def available_bytes(device: torch.device) -> int | None:
    """Memory a run can still take on ``device``, or ``None`` when it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    found = None
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        found = None
    room = _cgroup_room()
    known = [value for value in (found, room) if value is not None]
    return min(known) if known else None


def synthetic_data(config: RunConfig) -> Part | None:
    """The synthetic set's size from its config (``None`` for sets read from files)."""
    data = config.data
    if data.name != "synthetic":
        return None
    samples = data.num_train + data.num_test
    size = samples * (math.prod(data.shape) * FLOAT_BYTES + 8)
    shape = "x".join(map(str, data.shape))
    return Part("data", size, f"the synthetic dataset ({samples:,} samples of {shape})")


def _model_values(
    config: RunConfig, input_shape: tuple[int, ...], num_classes: int, model: nn.Module | None = None
) -> tuple[int, int]:
    """Values in the model's parameters and buffers, and in its frozen tensors (a transformer's base),
    counted on the meta device (nothing allocated; a pretrained checkpoint built from its config, its
    weights not read); a caller's ``model`` is counted as it is."""
    if model is None:
        with torch.random.fork_rng(devices=[]), torch.device("meta"), sizes_only():
            model = build_model(config.model.name, input_shape, num_classes, **config.model.options)
    return sum(t.numel() for t in (*model.parameters(), *model.buffers())), frozen_values(model)


def _per_sample_activations(model: nn.Module, input_shape: tuple[int, ...], cut: int) -> tuple[int, int]:
    """Output values of every layer for one sample, in the whole model and in its first ``cut`` blocks: one
    forward pass in eval mode, without gradients.

    Run on a real (already built) model: a meta-device forward would import half of torch's compiler.
    """
    whole, client, inside = [0], [0], [False]  # inside: the forward pass is in a client block

    def count(module: nn.Module, args: object, output: object) -> None:
        numel = output.numel() if isinstance(output, torch.Tensor) else 0
        whole[0] += numel
        client[0] += numel if inside[0] else 0

    def entering(now: bool) -> Callable[..., None]:
        return lambda *_: inside.__setitem__(0, now)

    leaves = [module for module in model.modules() if not any(module.children())]
    hooks = [module.register_forward_hook(count) for module in leaves]
    for block in list(model.children())[:cut]:
        hooks += [
            block.register_forward_pre_hook(entering(True)),
            block.register_forward_hook(entering(False)),
        ]
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, *input_shape))  # eval: BatchNorm takes one sample, keeps its stats
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    return whole[0], client[0]


def _plan(config: RunConfig, clients: int, largest: int | None) -> tuple[int, int, int, str]:
    """Clients, steps and width of the largest batch plan a round can draw, and the key that sets it.

    Every ``*epochs*`` knob of the algorithm (local training, fine-tuning, personal models...) plans its
    epochs at once, so the largest one counts. ``largest`` is the largest client's training set; the key
    is the batch size when it exceeds that (padding makes the plan), else what sets the number of steps.
    Without ``largest`` (the data not yet partitioned) a client of one sample gives the least plan any
    partition can have, and the key is the larger of the batch size and the steps' knob.
    """
    cfg = config.algorithm
    size = 1 if largest is None else largest
    batch = int(getattr(cfg, "batch_size", size))
    epochs = {k: v for k, v in cfg if "epochs" in k and isinstance(v, int)}
    most = max(epochs, key=epochs.__getitem__, default=None)
    steps = epochs.get(most, 1) * -(-size // batch)
    key = f"algorithm.{most}" if most is not None else "algorithm.batch_size"
    if (getattr(cfg, "local_steps", None) or 0) > steps:
        steps, key = cfg.local_steps, "algorithm.local_steps"
    if batch > (steps if largest is None else largest):
        key = "algorithm.batch_size"
    return clients, steps, batch, key


def _batch_shape(config: RunConfig, data: FederatedData) -> tuple[int, int, int, str]:
    """:func:`_plan` of the partitioned data."""
    return _plan(config, data.num_clients, int(data.client_sizes().max(initial=1)))


def _slots(config: RunConfig) -> int:
    """Optimizer values kept per model value: two for Adam, one for momentum, else none."""
    optimizer = getattr(config.algorithm, "optimizer", None)
    return 0 if optimizer is None else 2 if optimizer.kind == "adam" else 1 if optimizer.momentum > 0 else 0


def _model_parts(config: RunConfig, counts: tuple[int, int], plan: tuple[int, int, int, str]) -> list[Part]:
    """The global model, the frozen base (held once per process), every client's model and the largest
    batch plan."""
    slots = _slots(config)
    clients, steps, batch, key = plan
    values, frozen = counts
    base = [Part("model", frozen * FLOAT_BYTES, f"the frozen base of {frozen:,} values")] if frozen else []
    return base + [
        Part("model", values * (2 + slots) * FLOAT_BYTES, f"a model of {values:,} values"),
        Part(
            "partition.num_clients",
            values * (1 + slots) * clients * FLOAT_BYTES,
            f"{clients:,} clients' models",
        ),
        Part(
            key,
            clients * steps * batch * PLAN_BYTES,
            f"batch plans of {steps:,} step{'s' * (steps != 1)} x {batch:,} samples",
        ),
    ]


def _input(config: RunConfig) -> tuple[tuple[int, ...], int] | None:
    """Sample shape and classes of the configured dataset, known before it is loaded (``None``: only the
    loaded data tells, as for registered or custom sets and a crop the images cannot take)."""
    data = config.data
    if data.name == "synthetic":
        shape, classes = tuple(data.shape), data.num_classes
    elif data.name in SHAPES:
        shape, classes = SHAPES[data.name]
    else:
        return None
    if data.crop is not None:
        if len(shape) != 3 or data.crop > min(shape[1:]):
            return None
        shape = (shape[0], data.crop, data.crop)
    return shape, classes


def config_parts(config: RunConfig, model: nn.Module | None = None) -> list[Part | None]:
    """What the config alone tells, before any data is generated, loaded or partitioned: the synthetic
    set, and (where the dataset's shape is known) the model, the clients' models and the least batch plan
    a partition can give. Each is at most what :func:`state_parts` later counts, so this refuses nothing
    the later checks would run."""
    parts: list[Part | None] = [synthetic_data(config)]
    known = _input(config)
    if model is None and known is None:
        return parts
    try:
        values = _model_values(config, *(known or ((), 0)), model)
    except Exception:  # noqa: BLE001 -- a model that cannot take the input is reported once the data is loaded
        return parts
    return parts + _model_parts(config, values, _plan(config, config.partition.num_clients, None))


def state_parts(config: RunConfig, data: FederatedData, model: nn.Module | None = None) -> list[Part]:
    """Data, model, stacked clients and batch plans of a run whose data is loaded, before its model exists
    (or with the caller's ``model``)."""
    values = _model_values(config, data.input_shape, data.num_classes, model)
    dataset = data.dataset
    loaded = sum(t.numel() * t.element_size() for t in (dataset.x_train, dataset.y_train, dataset.x_test))
    return [
        Part("data", loaded, f"the {dataset.name} dataset"),
        *_model_parts(config, values, _batch_shape(config, data)),
    ]


def sample_activation_bytes(model: nn.Module, input_shape: tuple[int, ...], cut: int = 0) -> tuple[int, int]:
    """Bytes one sample's training step holds, every layer's output times :data:`ACTIVATION_FACTOR`: in the
    whole model, and in a split model's client part (its first ``cut`` blocks; 0 without a cut)."""
    whole, client = _per_sample_activations(model, input_shape, cut)
    return whole * FLOAT_BYTES * ACTIVATION_FACTOR, client * FLOAT_BYTES * ACTIVATION_FACTOR


def training_rows(config: RunConfig, data: FederatedData) -> int:
    """Samples in the largest training batch of one client."""
    return min(_batch_shape(config, data)[2], int(data.client_sizes().max(initial=1)))


def activation_parts(
    config: RunConfig, data: FederatedData, sample_bytes: int, clients_at_once: int = 1
) -> list[Part]:
    """Activations of the largest training batches of ``clients_at_once`` clients trained together (the
    batched executor's chunk) and of an evaluation batch, for a model whose training step holds
    ``sample_bytes`` per sample (:func:`sample_activation_bytes`)."""
    rows = training_rows(config, data)
    eval_rows = min(config.eval.batch_size, max(data.dataset.num_test, 1))
    together = f" of {clients_at_once:,} clients at once" if clients_at_once > 1 else ""
    return [
        Part(
            "algorithm.batch_size",
            clients_at_once * rows * sample_bytes,
            f"training batches of {rows:,}{together}",
        ),
        Part(
            "eval.batch_size",
            eval_rows * sample_bytes // ACTIVATION_FACTOR,
            f"evaluation batches of {eval_rows:,}",
        ),
    ]


def check(parts: list[Part | None], available: int | None, force: bool) -> None:
    """Raise a :class:`ConfigError` when the parts exceed ``available`` bytes.

    It names the first part that is too large on its own (data, then model, clients, batches: the cause
    more than its consequences), or else the largest.
    """
    known = [part for part in parts if part is not None]
    total = sum(part.bytes for part in known)
    if force or available is None or not known or total <= available:
        return
    alone = [part for part in known if part.bytes > available]
    cause = alone[0] if alone else max(known, key=lambda part: part.bytes)
    raise ConfigError(
        cause.key,
        f"this run needs about {human(total)} of memory ({cause.what}: {human(cause.bytes)}) "
        f"but {human(available)} is available; --force runs it anyway",
    )
