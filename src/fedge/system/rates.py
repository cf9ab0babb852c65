"""Unit conversions and Shannon rates on orthogonal sub-channels."""

from __future__ import annotations

import numpy as np


def dbm_to_watt(dbm: np.ndarray | float) -> np.ndarray:
    """Power in watts from dBm."""
    return 10.0 ** ((np.asarray(dbm, dtype=np.float64) - 30.0) / 10.0)


def noise_power_watt(noise_dbm_per_hz: float, bandwidth_hz: float) -> float:
    """Thermal noise power ``N0 * B`` over one sub-channel, in watts."""
    return float(dbm_to_watt(noise_dbm_per_hz) * bandwidth_hz)


def shannon_rate(bandwidth_hz: float | np.ndarray, snr: np.ndarray | float) -> np.ndarray:
    """Achievable rate ``B log2(1 + SNR)`` in bit/s (linear SNR; a band per client where given)."""
    return bandwidth_hz * np.log2(1.0 + np.asarray(snr, dtype=np.float64))
