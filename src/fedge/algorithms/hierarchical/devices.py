"""What a device profile (``system.devices``) changes in the hierarchy's radio and compute model.

HIST's own model (:class:`~fedge.algorithms.hierarchical.config.RadioConfig`) draws every client's CPU
frequency per global round from its band's range and folds power, path loss and noise into one SNR per
band at the radio's bandwidth. A profile replaces the figures it gives, client by client:

- ``cpu_hz``: the client's processor speed, fixed for the run, instead of the per-round draw (local
  steps' time and their ``kappa f^2`` energy);
- ``bandwidth_hz``: the client's OMA sub-channel. Its noise is over its own band, so its SNR is the band's
  times ``radio.bandwidth_hz / bandwidth_hz`` (same transmit power). Under AirComp a cell's clients send
  together on the same subcarriers: the cell's band is its narrowest client's, and the SNR per
  subcarrier does not change;
- ``distance_m`` and ``shadowing_db``: the client's path loss (3GPP) relative to a client at the middle
  of the system's distance range, whose SNR the band's SNR is taken to be; shadowing lowers it by its dB.
  OMA multiplies the client's SNR by this gain, AirComp its channel's power.

Availability and energy budgets are not read: every client of every cell works every round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.config import SystemConfig
from fedge.system.channel import path_loss_db
from fedge.system.profiles import DeviceProfiles


@dataclass(frozen=True)
class CellDevices:
    """The profile's figures for the active clients; ``None`` where the profile leaves one out."""

    cpu_hz: np.ndarray | None
    bandwidth_hz: np.ndarray | None
    path_gain: np.ndarray | None
    """each client's channel power gain relative to the reference client (distance and shadowing)"""

    @classmethod
    def of(cls, profiles: DeviceProfiles | None, system: SystemConfig, clients: int) -> CellDevices | None:
        """The figures of clients ``0 .. clients - 1`` (None without profiles)."""
        if profiles is None:
            return None
        given = profiles.given
        cpu = profiles.cpu_hz[:clients].copy() if "cpu_hz" in given else None
        bandwidth = profiles.bandwidth_hz[:clients].copy() if "bandwidth_hz" in given else None
        loss_db = np.zeros(clients)
        if "distance_m" in given:
            reference = path_loss_db((system.distance_min_m + system.distance_max_m) / 2)
            loss_db = loss_db + path_loss_db(profiles.distance_m[:clients]) - reference
        if "shadowing_db" in given:
            loss_db = loss_db + profiles.shadowing_db[:clients]
        path = 10.0 ** (-loss_db / 10.0) if {"distance_m", "shadowing_db"} & given else None
        return cls(cpu, bandwidth, path)
