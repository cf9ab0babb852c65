"""AirComp's receiver noise as a Gaussian mechanism (HIST Sec. V): what a cell's over-the-air aggregate
reveals of any one client, and the releases a run makes.

Over the air (HIST Eqs. 22-24) client i of cell j sends its accumulated gradient ``x_i`` with the
channel-inverting precoder ``alpha_i = 1 / (n_j m^H h_i)`` and the edge server combines with
``m = a / nu``: it receives ``y = (1/n_j) sum_i x_i + m^H z`` with ``z ~ CN(0, sigma^2 I_M)``, so the cell
mean plus an error of per-element variance ``MSE_j = sigma^2 / (P min_i |a^H h_i|^2)`` (Eq. 25; over
``n_j^2`` with the tight power normalisation), from the round's channels ``h_i`` and receive beamformer
``a`` (Eqs. 32-33). The edge model is ``x_j - gamma (mean_i x_i + Z_j)`` (Eqs. 26-27). Nothing else of a
client reaches the edge server, so the aggregate is a Gaussian mechanism for free once each ``x_i`` is
bounded: the paper's power constraint presumes bounded symbols but nothing bounds a gradient, so fedge
clips each client's transmitted ``x_i`` to L2 norm ``C`` (``algorithm.radio.clip``). Adding or removing
one client's data then moves the mean by at most the sensitivity ``C / n_j``, and the noise multiplier is

    z_j = std_j / (C / n_j) = n_j sqrt(MSE_j [/ 2]) / C,

``std_j`` being the realised noise std per element after receive beamforming (the halved variance is the
real part of the complex noise, ``noise_model: real_part``). The learning rate scales the mean and the
noise alike and leaves ``z_j`` unchanged. Each edge round of each cell is one release spending the
guarantee of the cell's clients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fedge.privacy.release import GAUSSIAN, Release

AIRCOMP = "aircomp"
"""The release kind of a cell's over-the-air aggregate."""


def aircomp_noise_std(mse: float, real_part: bool) -> float:
    """The noise std per element of the cell mean an edge server receives: ``sqrt(MSE_j)`` (Eq. 25 as the
    paper writes the noise) or ``sqrt(MSE_j / 2)`` (its real part)."""
    return math.sqrt(mse / 2 if real_part else mse)


def aircomp_sensitivity(clip: float, clients: int) -> float:
    """The L2 sensitivity of a cell's mean of ``clients`` transmissions each clipped to ``clip``."""
    return clip / clients


def aircomp_noise_multiplier(mse: float, clip: float, clients: int, real_part: bool = False) -> float:
    """``z_j = std_j / (C / n_j)``: the effective noise multiplier of a cell's over-the-air aggregate with
    per-element MSE ``mse`` (Eq. 25, from the round's channels and beamformer) over ``clients``
    transmissions clipped to L2 norm ``clip``."""
    return aircomp_noise_std(mse, real_part) / aircomp_sensitivity(clip, clients)


def aircomp_releases(
    round_: int,
    mses: Sequence[float],
    members: Sequence[Sequence[int]],
    clip: float,
    real_part: bool = False,
) -> list[Release]:
    """One edge round's releases: cell j's aggregate (MSE ``mses[j]``) spends its ``members[j]``'s
    client-level guarantee with multiplier :func:`aircomp_noise_multiplier`."""
    out = []
    for mse, cell in zip(mses, members, strict=True):
        z = aircomp_noise_multiplier(mse, clip, len(cell), real_part)
        sensitivity = aircomp_sensitivity(clip, len(cell))
        out.append(Release(round_, AIRCOMP, "client", GAUSSIAN, z, sensitivity, clients=tuple(cell)))
    return out
