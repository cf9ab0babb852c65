"""The aggregation pipeline: the ordered stages between the updates a node receives and its new state.

Every aggregation site of every family (a FedAvg server, a split server's client-model average, HIST's
edges and cloud, peers mixing their neighbours' models, an asynchronous server's buffer) hands its
stacked updates to :meth:`Pipeline.reduce` instead of averaging them by hand. The config's
``aggregation.stages`` lists the stages; each applies at the sites its ``at`` names (every site by
default). The stages at a site run in order; a reducer, if one is listed, must be the last of them,
and without one the site's own mean closes the chain (:mod:`fedge.aggregation.means`). With no stages
configured every site computes exactly what it computed before the pipeline existed.

On a run whose rows are spread over processes, a pipeline made only of an additive reducer (the mean)
reduces each process's rows and adds the partial results; any other pipeline first gathers every
process's rows, so that every process computes the same result as one process would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from fedge.aggregation.registry import BUILT_IN, MEAN, SITE_MEANS, STAGES, site_mean
from fedge.aggregation.stage import OptionError, Reducer, Stage, StageRun, Transform
from fedge.aggregation.updates import Part, Updates
from fedge.config import AggregationConfig
from fedge.distributed import Cohort
from fedge.errors import ConfigError
from fedge.tensors import Tensors

SITES = tuple(SITE_MEANS)


@dataclass(frozen=True)
class Pipeline:
    """The transforms and the reducer of one aggregation site, with the names the config gave them."""

    transforms: tuple[Transform, ...]
    reducer: Reducer
    names: tuple[str, ...]

    def reduce(self, updates: Updates, cohort: Cohort | None = None) -> Tensors:
        """The new state from ``updates``; ``cohort`` holds the rows' processes when only this process's
        rows are in ``updates`` (see the module's note)."""
        if cohort is None or not cohort.spread:
            return self._run(updates)
        if not self.transforms and self.reducer.additive:
            return _completed(cohort.sum(self.reducer.reduce(updates)), updates)
        return self._run(_gathered(updates, cohort))

    @property
    def stages(self) -> tuple[Stage, ...]:
        """Every stage in order (the transforms, then the reducer)."""
        return (*self.transforms, self.reducer)

    def _run(self, updates: Updates) -> Tensors:
        for stage in self.transforms:
            updates = stage.apply(updates)
        return _completed(self.reducer.reduce(updates), updates)


def _completed(out: Tensors, updates: Updates) -> Tensors:
    """A one-output site's result with every tensor its rows have: one the reducer left out (an integer
    counter, say) keeps the reference's value."""
    if updates.per_receiver:
        return out
    missing = [name for name in updates.parts[0].rows if name not in out]
    for name in missing:
        if updates.reference is None or name not in updates.reference:
            raise ValueError(f"the {updates.site}'s reducer left out {name!r} and the site has no own value")
        out[name] = updates.reference[name]
    return out


def _gathered(updates: Updates, cohort: Cohort) -> Updates:
    """Every process's rows and weights (the weights' last dimension runs over the rows)."""
    parts = []
    for part in updates.parts:
        rows = cohort.gather(part.rows)
        weights = cohort.gather({"w": part.weights.movedim(-1, 0)})["w"].movedim(0, -1)
        senders = None
        if part.senders is not None:
            senders = tuple(int(s) for s in cohort.gather_array(np.asarray(part.senders, dtype=np.int64)))
        parts.append(Part(rows, weights, cohort.gather(part.masks) if part.masks else {}, senders))
    return updates.with_parts(*parts)


def _built(name: str, site: str, options: dict[str, Any], key: str) -> Stage:
    """Stage ``name`` made with its options for ``site``, or one line naming the key."""
    factory: Callable[..., Stage] | None = STAGES.get(name)
    if name == MEAN:
        factory = partial(site_mean, site)
    if factory is None:
        known = ", ".join(sorted({*BUILT_IN, *STAGES}))
        raise ConfigError(f"{key}.name", f"unknown aggregation stage {name!r}; known: {known}")
    unknown = _unknown(factory, options)
    if unknown:
        raise ConfigError(f"{key}.options.{unknown}", f"{name} has no option {unknown!r}")
    try:
        stage = factory(**options)
    except OptionError as error:
        raise ConfigError(f"{key}.options.{error.option}", f"{name}: {error}") from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{key}.options", f"{name}: {error}") from None
    if not isinstance(stage, Transform | Reducer):
        raise ConfigError(f"{key}.name", f"{name} did not make a Transform or a Reducer")
    return stage


def _unknown(factory: Callable[..., Stage], options: dict[str, Any]) -> str | None:
    """The first option ``factory`` takes no keyword for (``None``: all taken, or it takes any)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: let the call decide
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    named = {p.name for p in parameters if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return next((option for option in options if option not in named), None)


def build_pipeline(config: AggregationConfig, site: str, run: StageRun | None = None) -> Pipeline:
    """The pipeline of ``site`` from ``aggregation.stages``: the stages that apply there, in order,
    each bound to ``run`` (its site alone when not given)."""
    run = StageRun(site) if run is None else run
    transforms: list[Transform] = []
    reducer: Reducer | None = None
    names: list[str] = []
    keys: list[str] = []
    for i, stage_config in enumerate(config.stages):
        if stage_config.at is not None and site not in stage_config.at:
            continue
        key = f"aggregation.stages.{i}"
        if reducer is not None:
            refused = f"{stage_config.name} comes after the reducer {names[-1]} at the {site}"
            raise ConfigError(key, f"{refused}; a reducer is the last stage")
        stage = _built(stage_config.name, site, stage_config.options, key)
        stage.bind(replace(run, key=key))
        if isinstance(stage, Reducer):
            reducer = stage
        else:
            transforms.append(stage)
        names.append(stage_config.name)
        keys.append(key)
    if reducer is None:
        reducer = site_mean(site)
        names.append(MEAN)
    pipeline = Pipeline(tuple(transforms), reducer, tuple(names))
    for stage, name, key in zip(pipeline.stages, names, keys, strict=False):  # the site's own mean: no key
        try:
            stage.check_pipeline(pipeline.stages)
        except ValueError as error:
            raise ConfigError(key, f"{name} at the {site}: {error}") from None
    return pipeline
