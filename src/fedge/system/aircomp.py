"""Over-the-air (AirComp) edge aggregation of HIST (Sec. V): SIMO signal model, channel-inversion
precoding, max-min receive beamforming, the aggregation error and the OFDM latency model.

Clients (one antenna) of a cell send one coordinate of their accumulated gradient at the same time on one
subcarrier; the edge server (``M`` antennas) combines with a receive beamformer ``m = a / nu`` and gets the
cell mean plus noise (Eq. 22-24). ``power_normalisation`` picks ``nu`` (docs/decisions.md, "AirComp power
normalisation"): ``"paper"`` is Eq. 23 as printed (``nu = sqrt(P) min_i |a^H h_i|``, per-element MSE
``sigma^2 / (P min_i |a^H h_i|^2)``, Eq. 25); ``"tight"`` uses the full client power (``nu`` larger by
``n_j``, MSE smaller by ``n_j^2``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Normalisation = Literal["paper", "tight"]


def min_gain(beamformer: np.ndarray, channels: np.ndarray) -> np.ndarray:
    """``min_i |a^H h_i|^2`` for unit beamformers ``[..., M]`` and channels ``[clients, M]``."""
    return np.min(np.abs(np.conj(beamformer) @ channels.T) ** 2, axis=-1)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def naive_beamformers(channels: np.ndarray) -> np.ndarray:
    """Closed-form candidates ``[clients + 1, M]``: each matched filter ``h_i/||h_i||`` and the principal
    eigenvector of ``sum_i h_i h_i^H``."""
    _, vectors = np.linalg.eigh(channels.T @ np.conj(channels))
    return np.vstack([_unit(channels), vectors[:, -1][None, :]])


def _sca(starts: np.ndarray, channels: np.ndarray, outer: int, inner: int, step: float) -> np.ndarray:
    """Successive convex approximation of ``max_{||a|| <= 1} min_i |a^H h_i|^2`` from every start at once.

    Each outer step lower-bounds ``|a^H h_i|^2 >= 2 Re(c_i^H a) - b_i`` at the current point
    (``c_i = h_i h_i^H a``, ``b_i = |h_i^H a|^2``) and solves the concave surrogate through its dual over
    the simplex, ``min_lambda 2 ||sum_i lambda_i c_i|| - sum_i lambda_i b_i`` (optimal ``a = g / ||g||``), by
    entropic mirror descent. A start keeps its new point only when its min-gain does not drop.
    """
    current = _unit(starts)
    best = min_gain(current, channels)
    for _ in range(outer):
        projection = np.conj(current) @ channels.T  # [R, n]: a^H h_i
        coeffs = channels[None, :, :] * np.conj(projection)[:, :, None]  # c_i = h_i (h_i^H a)
        offsets = np.abs(projection) ** 2
        weights = np.full(offsets.shape, 1.0 / offsets.shape[1])
        for _ in range(inner):
            g = np.einsum("rn,rnm->rm", weights, coeffs)
            norm = np.linalg.norm(g, axis=-1, keepdims=True)
            grad = 2.0 * np.real(np.einsum("rnm,rm->rn", np.conj(coeffs), g)) / norm - offsets
            scale = np.max(np.abs(grad), axis=-1, keepdims=True)
            weights = weights * np.exp(-step * grad / np.maximum(scale, 1e-300))
            weights /= weights.sum(axis=-1, keepdims=True)
        candidate = _unit(np.einsum("rn,rnm->rm", weights, coeffs))
        gain = min_gain(candidate, channels)
        better = gain >= best
        improvement = np.max((gain - best) / np.maximum(best, 1e-300))
        current = np.where(better[:, None], candidate, current)
        best = np.maximum(gain, best)
        if improvement < 1e-6:
            break
    return current


def receive_beamformer(
    channels: np.ndarray,
    rng: np.random.Generator,
    restarts: int = 4,
    outer: int = 30,
    inner: int = 60,
    step: float = 0.5,
) -> np.ndarray:
    """The normalised receive beamformer ``a`` (``||a|| = 1``) maximising ``min_i |a^H h_i|^2`` (Eq. 32-33).

    The paper (Sec. V-D) points to a Mirror-Prox SCA method without spelling it out; we run successive
    convex approximation with mirror descent on its dual from the best closed-form candidate and
    ``restarts`` random unit vectors, and keep the best.
    The result is never worse than the best closed-form candidate.
    """
    naive = naive_beamformers(channels)
    first = naive[np.argmax(min_gain(naive, channels))]
    random = _unit(
        rng.standard_normal((restarts, channels.shape[1]))
        + 1j * rng.standard_normal((restarts, channels.shape[1]))
    )
    found = _sca(np.vstack([first[None, :], random]), channels, outer, inner, step)
    return found[np.argmax(min_gain(found, channels))]


def aircomp_mse(snr: float, gain: float, clients: int, normalisation: Normalisation = "paper") -> float:
    """Per-element aggregation MSE (Eq. 25): ``sigma^2 / (P min_i |a^H h_i|^2)``, over ``n_j^2`` if tight.

    Only the ratio ``snr = P / sigma^2`` enters (HIST Sec. VI-C gives only SNRs).
    """
    mse = 1.0 / (snr * gain)
    return mse / clients**2 if normalisation == "tight" else mse


def normalisation_factor(
    beamformer: np.ndarray, channels: np.ndarray, power: float, normalisation: Normalisation = "paper"
) -> float:
    """``nu`` of Eq. 23: ``sqrt(P) min_i |a^H h_i|`` (``"paper"``), times ``n_j`` for ``"tight"``."""
    nu = float(np.sqrt(power * min_gain(beamformer, channels)))
    return nu * len(channels) if normalisation == "tight" else nu


def precoders(beamformer: np.ndarray, channels: np.ndarray, nu: float) -> np.ndarray:
    """Client transmit scalars (Eq. 23): channel inversion ``alpha_i = 1 / (n_j m^H h_i)``, ``m = a / nu``."""
    effective = np.conj(beamformer / nu) @ channels.T
    return 1.0 / (len(channels) * effective)


def aircomp_receive(
    values: np.ndarray,
    channels: np.ndarray,
    beamformer: np.ndarray,
    power: float,
    rng: np.random.Generator,
    normalisation: Normalisation = "paper",
    noise_power: float = 1.0,
) -> np.ndarray:
    """The signal-level AirComp estimate of the clients' mean (Eq. 22 with the precoding of Eq. 23).

    ``values`` are ``[clients, K]`` real symbols sent in ``K`` slots; every slot receives
    ``y = m^H (sum_i h_i alpha_i x_i + z)`` with ``z ~ CN(0, sigma^2 I_M)``. The complex result is unbiased
    for the mean and its error has variance :func:`aircomp_mse` per element (Eq. 24-25).
    """
    nu = normalisation_factor(beamformer, channels, power, normalisation)
    alpha = precoders(beamformer, channels, nu)
    combiner = beamformer / nu
    shape = (channels.shape[1], values.shape[1])
    noise = np.sqrt(noise_power) * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2)
    received = (channels * alpha[:, None]).T @ values + noise  # [M, K] at the antennas
    return np.conj(combiner) @ received


def aircomp_uplink_seconds(
    values: float, bandwidth_hz: float, subcarrier_hz: float, symbol_s: float
) -> float:
    """Analog OFDM uplink of ``values`` coordinates (Eq. 34): ``values / (B / df)`` symbols of ``t_s``.

    Independent of the number of clients: they all transmit at once.
    """
    return float(values / (bandwidth_hz / subcarrier_hz) * symbol_s)


def aircomp_edge_latency(
    steps: int,
    fraction: float,
    cycles_per_step: float,
    cpu_hz: np.ndarray,
    values: float,
    bandwidth_hz: float,
    subcarrier_hz: float,
    symbol_s: float,
) -> float:
    """Seconds of one AirComp edge round of a cell (Eq. 35): slowest client's compute plus the uplink."""
    compute = aircomp_compute_seconds(steps, fraction, cycles_per_step, cpu_hz)
    return float(compute + aircomp_uplink_seconds(values, bandwidth_hz, subcarrier_hz, symbol_s))


def aircomp_compute_seconds(steps: int, fraction: float, cycles_per_step: float, cpu_hz: np.ndarray) -> float:
    """The slowest client's compute seconds in one edge round (the first term of Eq. 35)."""
    return steps * fraction * cycles_per_step / np.min(np.asarray(cpu_hz, dtype=np.float64))


def aircomp_cost_per_value(
    edge_rounds: int,
    steps: int,
    cycles_per_step: float,
    model_values: int,
    cpu_hz: np.ndarray,
    bandwidth_hz: float,
    subcarrier_hz: float,
    symbol_s: float,
) -> float:
    """Latency per model value a cell holds in one global round (the ``c_j`` of Eq. 36).

    ``c_j = E (H V_0 / (d min_i F_i) + t_s df / B)``; the MSE's dependence on ``d_j`` is left out, as in the
    paper.
    """
    slowest = float(np.min(np.asarray(cpu_hz, dtype=np.float64)))
    return float(
        edge_rounds
        * (steps * cycles_per_step / (model_values * slowest) + symbol_s * subcarrier_hz / bandwidth_hz)
    )
