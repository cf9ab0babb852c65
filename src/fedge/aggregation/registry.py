"""Aggregation stages by name: the built-in ones, and those registered by :func:`fedge.register_stage`
or an installed package's ``fedge.stages`` entry point.

A stage is a class (or any callable) that, called with a stage's ``options`` as keywords, returns a
:class:`~fedge.aggregation.stage.Transform` or a :class:`~fedge.aggregation.stage.Reducer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedge.aggregation import sites
from fedge.aggregation.clipped_gossip import ClippedGossip
from fedge.aggregation.fltrust import FLTrust
from fedge.aggregation.means import AnchoredMean, BlockMean, WeightedMean
from fedge.aggregation.private import Clip, Gaussian, GaussianShare
from fedge.aggregation.robust import ROBUST
from fedge.aggregation.secure import SecureAggregation
from fedge.aggregation.stage import Reducer, Stage

SITE_MEANS: dict[str, type[Reducer]] = {
    sites.SERVER: WeightedMean,
    sites.EDGE: BlockMean,
    sites.PEER: WeightedMean,
    sites.BUFFER: WeightedMean,
    sites.CLOUD: AnchoredMean,
}
"""The mean every site takes when no reducer is configured (its paper's)."""

MEAN = "mean"
"""The built-in stage name for a site's own mean."""

STAGES: dict[str, Callable[..., Stage]] = {
    "clip": Clip,
    "gaussian_share": GaussianShare,
    "gaussian": Gaussian,
    "secagg": SecureAggregation,
    **ROBUST,
    "clipped_gossip": ClippedGossip,
    "fltrust": FLTrust,
}
"""Stages by name: fedge's own (client-level DP's, :mod:`fedge.aggregation.private`; secure
aggregation, :mod:`fedge.aggregation.secure`; Byzantine-robust aggregation,
:mod:`fedge.aggregation.robust`) and the registered ones (the built-in ``mean`` is
resolved per site, not through this table)."""

BUILT_IN = frozenset({MEAN})


def site_mean(site: str, **options: Any) -> Reducer:
    """The site's own mean (``mean`` takes no options)."""
    if options:
        raise TypeError(f"takes no options (got {', '.join(sorted(options))})")
    return SITE_MEANS[site]()
