"""The public extension API: register models, datasets, algorithms and aggregation stages by name for use
from YAML.

``register_model(name, factory)``: ``factory(input_shape, num_classes, **options) -> nn.Module``; its
keyword-only, annotated parameters are the ``model.options`` a config may set (checked like the zoo's).
``register_dataset(name, loader)``: ``loader(data_config, seed)`` returns a
:class:`~fedge.data.dataset.Dataset` or a ``(train, test)`` pair, each a torch Dataset or ``(X, y)``.
``register_algorithm(name, cls, config_cls)``: an :class:`~fedge.algorithms.Algorithm` subclass and its
config (a subclass of :class:`~fedge.config.AlgorithmConfig`). ``register_stage(name, factory)``:
``factory(**options)`` returns an aggregation :class:`~fedge.aggregation.Transform` or
:class:`~fedge.aggregation.Reducer` (:mod:`fedge.aggregation.pipeline`). A name that a built-in already
has, or that another object already took, is refused with a one-line error. Installed packages register
through
the entry-point groups of :mod:`fedge.intake.plugins`; :func:`load_entry_points` loads them once.

:func:`parse_config` and :func:`load_config` are the config readers of every layer above this one (the
API, the runner's resume, sweeps and their worker processes, comparisons, the command line): they load
the installed plugins first, so a plugin's algorithm, model or dataset works wherever a built-in does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from fedge import config
from fedge.aggregation import SITES, STAGES, Stage, build_pipeline
from fedge.aggregation import registry as aggregation_registry
from fedge.algorithms import ALGORITHMS, Algorithm, register
from fedge.config import AlgorithmConfig, DataConfig, RunConfig
from fedge.data.dataset import Dataset
from fedge.data.sources import SOURCES
from fedge.data.user import user_dataset
from fedge.errors import ConfigError
from fedge.intake import plugins
from fedge.models import MODELS
from fedge.models.registry import validate_options

BUILT_IN = {
    "model": frozenset(MODELS),
    "dataset": frozenset(SOURCES),
    "algorithm": frozenset(ALGORITHMS),
    "stage": frozenset(aggregation_registry.BUILT_IN),
}
_LOADED: set[str] = set()


def _check_name(kind: str, name: str, table: dict[str, Any], value: Any, same: Callable[[Any], bool]) -> bool:
    """Whether ``name`` is new (``False``: already registered to this very object); raise on a clash."""
    where = f"fedge.register_{kind}({name!r})"
    if not isinstance(name, str) or not name.isidentifier() and not name.replace("-", "_").isidentifier():
        raise ConfigError(where, "a name is letters, digits, '_' or '-'")
    if name in BUILT_IN[kind]:
        raise ConfigError(where, f"collides with fedge's built-in {kind} {name!r}; choose another name")
    if name in table:
        if same(table[name]):
            return False
        raise ConfigError(where, f"{name!r} is already registered to another {kind}")
    if not callable(value):
        raise ConfigError(where, f"expected a callable, got {type(value).__name__}")
    return True


def register_model(name: str, factory: Callable[..., nn.Module]) -> None:
    """Make ``model.name: NAME`` build ``factory(input_shape, num_classes, **model.options)``."""
    if _check_name("model", name, MODELS, factory, lambda old: old is factory):
        MODELS[name] = factory


def register_dataset(name: str, loader: Callable[[DataConfig, int], Any]) -> None:
    """Make ``data.name: NAME`` load ``loader(data_config, seed)`` (a Dataset or a (train, test) pair)."""
    if not _check_name("dataset", name, SOURCES, loader, lambda old: getattr(old, "loader", None) is loader):
        return

    def source(cfg: DataConfig, seed: int) -> Dataset:
        loaded = loader(cfg, seed)
        if isinstance(loaded, Dataset):
            return loaded
        if not isinstance(loaded, tuple | list) or len(loaded) != 2:
            raise ConfigError("data.name", f"the {name} loader must return a Dataset or a (train, test) pair")
        return user_dataset(loaded[0], loaded[1], seed, cfg.test_fraction)

    source.loader = loader  # type: ignore[attr-defined]
    source.__doc__ = inspect.getdoc(loader)
    SOURCES[name] = source
    DataConfig.registered.add(name)


def register_algorithm(name: str, cls: type[Algorithm], config_cls: type[AlgorithmConfig]) -> None:
    """Make ``algorithm.name: NAME`` build ``cls(ctx, config_cls(...))``."""
    if not _check_name("algorithm", name, ALGORITHMS, cls, lambda old: old is cls):
        return
    where = f"fedge.register_algorithm({name!r})"
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(where, "the class must subclass fedge.algorithms.Algorithm")
    if not (isinstance(config_cls, type) and issubclass(config_cls, AlgorithmConfig)):
        raise ConfigError(where, "the config class must subclass fedge.config.AlgorithmConfig")
    doc = (inspect.getdoc(cls) or name).splitlines()[0]
    register(name, config_cls, doc)(cls)


def register_stage(name: str, factory: Callable[..., Stage]) -> None:
    """Make ``aggregation.stages: [{name: NAME, options: {...}}]`` apply ``factory(**options)``, a
    :class:`~fedge.aggregation.Transform` or a :class:`~fedge.aggregation.Reducer`."""
    if _check_name("stage", name, STAGES, factory, lambda old: old is factory):
        STAGES[name] = factory


REGISTER = {
    "models": register_model,
    "datasets": register_dataset,
    "algorithms": register_algorithm,
    "stages": register_stage,
}


def load_entry_points() -> None:
    """Import and register every installed package's models, datasets and algorithms (once per name).

    A model or dataset entry point is the factory or loader itself; an algorithm entry point is the
    algorithm class, whose ``config_class`` attribute names its config class.
    """
    for kind, add in REGISTER.items():
        for point in plugins.discovered(kind):
            key = f"{kind}:{point.name}:{point.value}"
            if key in _LOADED:
                continue
            try:
                value = point.load()
            except Exception as error:  # a broken plugin: one line naming it, not a traceback
                raise ConfigError(f"entry point {point.value}", f"cannot be loaded ({error})") from None
            if kind == "algorithms":
                config_cls = getattr(value, "config_class", None)
                add(point.name, value, config_cls)
            else:
                add(point.name, value)
            _LOADED.add(key)


def parse_config(raw: dict[str, Any]) -> RunConfig:
    """A nested dict validated into a :class:`RunConfig`, installed plugins registered first."""
    load_entry_points()
    return _options_checked(config.parse_config(raw))


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """A YAML config file (or the defaults) with dotted overrides, installed plugins registered first."""
    load_entry_points()
    return _options_checked(config.load_config(path, overrides))


def _options_checked(parsed: RunConfig) -> RunConfig:
    """``parsed``, its zoo model's options checked against the builder (as building it would), so that
    a sweep refuses a misspelt option before any run starts; a model outside the zoo is the user's."""
    if parsed.model.name in MODELS:
        validate_options(parsed.model.name, parsed.model.options)
    for site in SITES:  # a misspelt stage, its options or its order: refused before any run starts
        build_pipeline(parsed.aggregation, site)
    return parsed
