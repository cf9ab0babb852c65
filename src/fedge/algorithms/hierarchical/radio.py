"""The random state of HIST's wireless system in a run: CPU frequencies, channels and beamformers.

Redraws follow the paper's indices (Eq. 17's ``F_i^t`` per global round, Eq. 22's channels per edge round):
CPU frequencies and OMA channels per client per global round, AirComp channels (and so beamformers) per cell
per edge round. Every draw has its own named stream of the run seed, so a round's radio does not depend on
what was drawn before it. A device profile replaces the figures it gives
(:mod:`~fedge.algorithms.hierarchical.devices`).
"""

from __future__ import annotations

import numpy as np

from fedge.algorithms.hierarchical.config import RadioConfig
from fedge.algorithms.hierarchical.devices import CellDevices
from fedge.rng import numpy_rng
from fedge.runtime.hierarchy import Cells
from fedge.system.aircomp import aircomp_mse, min_gain, receive_beamformer
from fedge.system.oma import complex_gaussian, db_to_linear, oma_rates


class CellRadio:
    """Per-cell SNRs and CPU ranges, and the per-round draws of a run's clients (``devices``: the
    figures a device profile gives, which replace them)."""

    def __init__(self, cfg: RadioConfig, cells: Cells, seed: int, devices: CellDevices | None = None):
        self.cfg = cfg
        self.cells = cells
        self.seed = seed
        self.devices = devices
        self.snr = db_to_linear(cfg.snr_db)[cells.groups(len(cfg.snr_db))]  # per cell, linear
        ranges = np.asarray(cfg.cpu_ghz, dtype=np.float64)[cells.groups(len(cfg.cpu_ghz))]
        self.cpu_range_hz = 1e9 * ranges[cells.cell_of]  # per active client, [low, high]
        self.bandwidth_hz: float | np.ndarray = cfg.bandwidth_hz  # per active client with a profile's
        self.oma_snr = self.snr[cells.cell_of]  # per active client, linear
        if devices is not None and devices.bandwidth_hz is not None:
            self.bandwidth_hz = devices.bandwidth_hz
            self.oma_snr = self.oma_snr * (cfg.bandwidth_hz / devices.bandwidth_hz)  # noise over its band
        if devices is not None and devices.path_gain is not None:
            self.oma_snr = self.oma_snr * devices.path_gain

    def cell_bandwidth_hz(self) -> np.ndarray:
        """Each cell's AirComp band: its clients share the subcarriers, so the narrowest client's."""
        per_client = np.broadcast_to(np.asarray(self.bandwidth_hz, dtype=np.float64), (self.cells.size,))
        return per_client.reshape(self.cells.num_cells, self.cells.per_cell).min(axis=1)

    def cpu_hz(self, round_: int) -> np.ndarray:
        """Every active client's CPU frequency in global round ``round_``: uniform on its cell's range, or
        the profile's speed."""
        if self.devices is not None and self.devices.cpu_hz is not None:
            return self.devices.cpu_hz.copy()
        rng = numpy_rng(self.seed, "hist-cpu", round_)
        low, high = self.cpu_range_hz[:, 0], self.cpu_range_hz[:, 1]
        return low + (high - low) * rng.random(len(low))

    def oma_rates(self, round_: int) -> np.ndarray:
        """Every active client's OMA uplink rate (bit/s) in ``round_``, from ``h ~ CN(0, I_M)``."""
        channels = complex_gaussian(
            numpy_rng(self.seed, "hist-oma-channel", round_), (self.cells.size, self.cfg.antennas)
        )
        return oma_rates(self.bandwidth_hz, self.oma_snr, channels)

    def aircomp_mse(self, round_: int, edge_round: int, cell: int) -> float:
        """Per-element MSE of cell ``cell``'s AirComp aggregation in edge round ``(round_, edge_round)``:
        fresh channels of its clients, the optimised receive beamformer, then Eq. 25."""
        channels = complex_gaussian(
            numpy_rng(self.seed, "hist-aircomp-channel", round_, edge_round, cell),
            (self.cells.per_cell, self.cfg.antennas),
        )
        if self.devices is not None and self.devices.path_gain is not None:  # each client's path loss
            channels = channels * np.sqrt(self.devices.path_gain[self.cells.members(cell)])[:, None]
        rng = numpy_rng(self.seed, "hist-beamformer", round_, edge_round, cell)
        beamformer = receive_beamformer(channels, rng, restarts=self.cfg.beamformer_restarts)
        gain = float(min_gain(beamformer, channels))
        return aircomp_mse(float(self.snr[cell]), gain, self.cells.per_cell, self.cfg.power_normalisation)
