"""AirComp's edge aggregation: the over-the-air estimate of a cell's client mean as the edge pipeline's
reducer (:class:`OverTheAir`); OMA's edge servers take the pipeline's own (their clients' mean).

AirComp's estimate is the exact client mean minus the learning rate times the channel's effective
noise, drawn per coordinate of the full model and cut like the cell's submodel (HIST Eqs. 25-27).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedge.aggregation import Reducer, Updates, sites
from fedge.algorithms.base import Context
from fedge.algorithms.hierarchical.config import HierarchicalConfig
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.algorithms.hierarchical.submodel import CellViews, Tensors
from fedge.errors import ConfigError
from fedge.rng import torch_rng


@dataclass(frozen=True)
class OverTheAir(Reducer):
    """AirComp's edge aggregation (HIST Eqs. 25-27) as the edge site's reducer.

    Over the air an edge server never receives its clients' models one by one, only their superposed
    analogue signals: the reception is the aggregation. So AirComp is the reducer of the edge's pipeline,
    not a stage before or after it: the site's own reducer ``inner`` gives the sum the air computes (it
    must be additive: a median, say, cannot be computed over the air), then each cell ``j`` receives it
    with the channel's effective noise, ``scales[j]`` times ``noise(j)`` (the cell's unit noise on each
    noisy tensor). Transforms before it act on what each client transmits. The noise is drawn once, so
    on a run spread over processes this reducer sees every process's rows (it is not additive).
    ``mses`` are the cells' per-element MSEs (Eq. 25) the scales come from.
    """

    additive: ClassVar[bool] = False
    inner: Reducer
    mses: tuple[float, ...]
    scales: tuple[float, ...]
    noise: Callable[[int], Tensors]

    def reduce(self, updates: Updates) -> Tensors:
        out = self.inner.reduce(updates)
        for j, scale in enumerate(self.scales):
            for name, unit in self.noise(j).items():
                out[name][j] -= scale * unit
        return out


def over_the_air(
    inner: Reducer,
    cfg: HierarchicalConfig,
    radio: CellRadio,
    ctx: Context,
    params: Tensors,
    t: int,
    e: int,
    views: CellViews,
) -> OverTheAir:
    """The edge servers' AirComp reducer in edge round ``(t, e)``: ``inner`` plus ``gamma Z_j``, the edge
    model being ``x_j - gamma (mean_i delta_i + Z_j)`` = client mean ``- gamma Z_j`` (Eq. 26-27). ``Z_j``
    is i.i.d. real Gaussian on the values the cell holds with the Eq. 25 MSE as variance
    (``noise_model="paper"``, docs/decisions.md, "Real AirComp noise") or half of it (``"real_part"``),
    drawn per coordinate of the full model's ``params`` and cut like the submodel, so both forms see the
    same noise."""
    mses = tuple(radio.aircomp_mse(t, e, j) for j in range(radio.cells.num_cells))
    half = cfg.radio.noise_model == "real_part"
    scales = tuple(cfg.optimizer.lr * float(np.sqrt(mse / 2 if half else mse)) for mse in mses)

    def noise(j: int) -> Tensors:
        gen = torch_rng(ctx.seed, "hist-aircomp-noise", t, e, j, device=ctx.device)
        out = {}
        for name, full in params.items():
            unit = torch.randn(full.shape, generator=gen, device=full.device, dtype=full.dtype)
            out[name] = views.cut(name, unit, j)
        return out

    return OverTheAir(inner, mses, scales, noise)


def check_over_the_air(ctx: Context) -> None:
    """AirComp needs an additive reducer at the edge (what the air sums); raises :class:`ConfigError`."""
    reducer = ctx.pipeline(sites.EDGE).reducer
    if not reducer.additive:
        name = ctx.pipeline(sites.EDGE).names[-1]
        raise ConfigError(
            "aggregation.stages", f"AirComp sums over the air: the edge cannot reduce by {name}"
        )
