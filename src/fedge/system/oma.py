"""HIST's OMA (TDMA) uplink model (Sec. IV-A): Rayleigh SIMO channels, per-cell SNR, cycle-counted compute.

Only client-side delays count: local computation and the client-to-edge uplink (edge, cloud and downlink
delays are neglected, as the paper assumes). Clients of a cell upload one after another (TDMA), each at
the Shannon rate ``R_i = B log2(1 + SNR_j ||h_i||^2)`` of its channel ``h_i ~ CN(0, I_M)``. Compute time
and upload size scale with the fraction ``d_j / d`` of the model a cell trains. Path loss, distances and
the separate values of ``P_j`` and ``sigma_0^2`` do not enter: the SNR absorbs them (HIST Sec. VI-C gives
only SNRs).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fedge.system.rates import shannon_rate


def db_to_linear(db: npt.ArrayLike) -> np.ndarray:
    """A power ratio from decibels."""
    return 10.0 ** (np.asarray(db, dtype=np.float64) / 10.0)


def complex_gaussian(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """I.i.d. circularly-symmetric ``CN(0, 1)`` entries (Rayleigh block fading, unit mean power)."""
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2.0)


def oma_rates(bandwidth_hz: float | np.ndarray, snr: np.ndarray | float, channels: np.ndarray) -> np.ndarray:
    """Uplink rate of each client (bit/s): ``B log2(1 + SNR ||h_i||^2)`` for channels ``[clients, M]``
    (``bandwidth_hz`` and ``snr`` one for all or one per client)."""
    gain = np.sum(np.abs(channels) ** 2, axis=-1)
    return shannon_rate(bandwidth_hz, np.asarray(snr, dtype=np.float64) * gain)


def oma_edge_latency(
    steps: int,
    fraction: float,
    cycles_per_step: float,
    cpu_hz: np.ndarray,
    upload_bits: np.ndarray | float,
    rates_bps: np.ndarray,
) -> float:
    """Seconds of one edge round of a cell (Eq. 17): ``max_i [H (d_j/d) V_0 / F_i + n_j bits_i / R_i]``.

    ``cpu_hz``, ``upload_bits`` and ``rates_bps`` hold one entry per client of the cell; the TDMA factor
    ``n_j`` multiplies each client's own upload time, and the max is over the sum (as the paper writes it).
    """
    compute, upload = oma_edge_phases(steps, fraction, cycles_per_step, cpu_hz, upload_bits, rates_bps)
    return float(np.max(compute + upload))


def oma_edge_phases(
    steps: int,
    fraction: float,
    cycles_per_step: float,
    cpu_hz: np.ndarray,
    upload_bits: np.ndarray | float,
    rates_bps: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each client's compute seconds and TDMA upload seconds in one edge round (the two terms of Eq. 17)."""
    cpu_hz = np.asarray(cpu_hz, dtype=np.float64)
    clients = len(cpu_hz)
    compute = steps * fraction * cycles_per_step / cpu_hz
    upload = clients * np.asarray(upload_bits, dtype=np.float64) / np.asarray(rates_bps, dtype=np.float64)
    return compute, upload


def oma_cost_per_value(
    edge_rounds: int,
    steps: int,
    cycles_per_step: float,
    model_values: int,
    cpu_hz: np.ndarray,
    rates_bps: np.ndarray,
    bits_per_value: float = 32,
) -> float:
    """Latency per model value a cell holds in one global round (the ``c_j`` of Eq. 19).

    ``c_j = E max_i [H V_0 / (F_i d) + n_j L_0 / (R_i d)]`` with ``L_0 = bits_per_value * d``, so that the
    global-round latency of a cell holding ``d_j`` values is ``c_j d_j``.
    """
    cpu_hz = np.asarray(cpu_hz, dtype=np.float64)
    per_value = steps * cycles_per_step / (cpu_hz * model_values) + len(cpu_hz) * bits_per_value / np.asarray(
        rates_bps, dtype=np.float64
    )
    return float(edge_rounds * np.max(per_value))


def global_round_latency(edge_latency_per_cell: np.ndarray, edge_rounds: int) -> float:
    """Seconds of one global round (Eq. 18): cells work in parallel, ``E`` edge rounds each."""
    return float(edge_rounds * np.max(edge_latency_per_cell))
