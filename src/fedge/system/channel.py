"""Large- and small-scale channel models: 3GPP macro path loss, client distances, Rayleigh fading."""

from __future__ import annotations

from typing import Literal

import numpy as np


def path_loss_db(distance_m: np.ndarray | float) -> np.ndarray:
    """3GPP macro-cell path loss ``128.1 + 37.6 log10(d)`` in dB, with ``d`` in **kilometres**.

    Lightweight FedSL (Sec. IV) gives the formula without units; metres would make every link ~200 dB
    lossy, so kilometres is our completion (docs/decisions.md, "Path loss with the distance in
    kilometres"), taken as every call's convention.
    """
    return 128.1 + 37.6 * np.log10(np.asarray(distance_m, dtype=np.float64) / 1000.0)


def gain_from_db(loss_db: np.ndarray) -> np.ndarray:
    """Linear power gain of a loss in dB."""
    return 10.0 ** (-np.asarray(loss_db) / 10.0)


def draw_distances(
    rng: np.random.Generator, count: int, low_m: float, high_m: float, mode: Literal["uniform", "linspace"]
) -> np.ndarray:
    """Client-to-base-station distances: i.i.d. uniform on ``[low, high]`` or evenly spaced."""
    if mode == "linspace":
        return np.linspace(low_m, high_m, count)
    return rng.uniform(low_m, high_m, size=count)


def rayleigh_power(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Rayleigh block fading as a power gain ``|h|^2 ~ Exp(1)`` (unit mean)."""
    return rng.exponential(1.0, size=shape)
