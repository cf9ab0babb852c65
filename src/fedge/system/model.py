"""The wireless system of a run: per-client distances, per-round rates, and the cost of each phase.

Defaults follow lightweight FedSL's Sec. IV and our completion of it (docs/decisions.md, "Platform"):
5 MHz orthogonal sub-channel per client on both links, 23 dBm client and 37 dBm base-station power,
-174 dBm/Hz noise, 3GPP path loss with distances uniform on [100, 300] m drawn once per run, Shannon
rates. Fading (Exp(1) power per client and round) and the
compute model (FLOPs x cycles-per-FLOP at a CPU frequency, kappa f^2 energy; the server's stated power
draw) are our completions, labelled as such in the config, at each node kind's plausible efficiency
(:func:`energy_assumption` states them beside every printed energy figure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedge.config import SystemConfig
from fedge.rng import numpy_rng
from fedge.system.channel import draw_distances, gain_from_db, path_loss_db, rayleigh_power
from fedge.system.clock import (
    CLIENT_COMPUTE,
    DOWNLINK,
    PEER,
    SERVER,
    SERVER_COMPUTE,
    UPLINK,
    Clock,
    RoundCost,
    client_nodes,
)
from fedge.system.compute import compute_energy, compute_seconds
from fedge.system.profiles import DeviceProfiles, device_profiles, profiles_csv
from fedge.system.rates import dbm_to_watt, noise_power_watt, shannon_rate


@dataclass(frozen=True)
class WirelessLink:
    """Per-client uplink and downlink rates (bit/s) in one round."""

    up_bps: np.ndarray
    down_bps: np.ndarray


@dataclass(frozen=True)
class PhaseCost:
    """Seconds and joules of one phase, one entry per participant row: the time the phase takes on the
    row's path, the joules it costs, and the node that spends them (``payers[r]``; None where only the
    time is asked for)."""

    seconds: np.ndarray
    joules: np.ndarray
    phase: str
    payers: list[str] | None = None


def energy_assumption(cfg: SystemConfig) -> str:
    """The energy model's figures per node kind, in one line, to print beside a run's joules: each
    compute's FLOPs per joule (a client's at the nominal ``client_cpu_hz``) and the transmit powers."""
    client = 1.0 / (cfg.kappa * cfg.client_cpu_hz**2 * cfg.cycles_per_flop) if cfg.kappa else math.inf
    server_flops = cfg.server_cpu_hz / cfg.cycles_per_flop
    server = server_flops / cfg.server_compute_w if cfg.server_compute_w else math.inf
    return (
        f"client {_efficiency(client)} (kappa {cfg.kappa:g} at {cfg.client_cpu_hz / 1e9:g} GHz), "
        f"server {_efficiency(server)} ({cfg.server_compute_w:g} W at {server_flops:g} FLOP/s); "
        f"transmit {dbm_to_watt(cfg.client_power_dbm):.3g} W client, "
        f"{dbm_to_watt(cfg.server_power_dbm):.3g} W base station"
    )


def _efficiency(flops_per_joule: float) -> str:
    """FLOPs per joule as ``N GFLOP/J``, three significant digits (``free`` for a cost of zero)."""
    return "free" if math.isinf(flops_per_joule) else f"{flops_per_joule / 1e9:.3g} GFLOP/J"


class SystemModel:
    """Rates, latency and energy of clients talking to one base station / server."""

    def __init__(self, cfg: SystemConfig, num_clients: int, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.distances_m = draw_distances(
            numpy_rng(seed, "system-distances"),
            num_clients,
            cfg.distance_min_m,
            cfg.distance_max_m,
            cfg.distances,
        )
        self.path_gain = gain_from_db(path_loss_db(self.distances_m))
        self.noise_w = noise_power_watt(cfg.noise_dbm_per_hz, cfg.bandwidth_hz)
        self.bandwidth_hz: float | np.ndarray = cfg.bandwidth_hz
        self.cpu_hz: float | np.ndarray = cfg.client_cpu_hz
        self.profiles: DeviceProfiles | None = None
        if cfg.devices is not None:  # per-client figures; without them every client is the system's
            self.profiles = device_profiles(cfg, num_clients, seed)
            self.distances_m = self.profiles.distance_m
            self.path_gain = gain_from_db(path_loss_db(self.distances_m) + self.profiles.shadowing_db)
            self.bandwidth_hz = self.profiles.bandwidth_hz
            self.noise_w = dbm_to_watt(cfg.noise_dbm_per_hz) * self.bandwidth_hz
            self.cpu_hz = self.profiles.cpu_hz
        self.client_power_w = float(dbm_to_watt(cfg.client_power_dbm))
        self.server_power_w = float(dbm_to_watt(cfg.server_power_dbm))
        self.clock = Clock()

    def online(self, round_: int) -> np.ndarray:
        """Which clients can take part in ``round_``: online by their availability (draw or trace) and
        with energy left in their budget (all of them without device profiles)."""
        count = len(self.distances_m)
        if self.profiles is None:
            return np.ones(count, dtype=bool)
        spent = self.clock.node_joules()
        used = np.array([spent.get(name, 0.0) for name in client_nodes(np.arange(count))])
        return self.profiles.online(self.seed, round_) & (used < self.profiles.energy_budget_j)

    def devices_csv(self) -> str:
        """The per-client profiles as ``devices.csv`` text (empty without device profiles)."""
        if self.profiles is None:
            return ""
        nominal = WirelessLink(
            shannon_rate(self.bandwidth_hz, self.client_power_w * self.path_gain / self.noise_w),
            shannon_rate(self.bandwidth_hz, self.server_power_w * self.path_gain / self.noise_w),
        )
        return profiles_csv(self.profiles, nominal.up_bps, nominal.down_bps)

    def client_cpu_hz(self, clients: np.ndarray | None) -> float | np.ndarray:
        """The processor speed of ``clients`` (the system's nominal speed where they are not named)."""
        if clients is None or np.ndim(self.cpu_hz) == 0:
            return self.cfg.client_cpu_hz if clients is None else self.cpu_hz
        return np.asarray(self.cpu_hz)[np.asarray(clients)]

    def link(self, round_: int) -> WirelessLink:
        """Every client's rates in ``round_`` (fading redrawn per round when enabled)."""
        gain = self.path_gain
        if self.cfg.fading == "rayleigh":
            gain = gain * rayleigh_power(numpy_rng(self.seed, "fading", round_), gain.shape)
        up = shannon_rate(self.bandwidth_hz, self.client_power_w * gain / self.noise_w)
        down = shannon_rate(self.bandwidth_hz, self.server_power_w * gain / self.noise_w)
        return WirelessLink(up, down)

    def upload(self, clients: np.ndarray, bits: np.ndarray, round_: int) -> PhaseCost:
        """Clients sending ``bits`` each on their uplinks (transmit energy at the client)."""
        seconds = np.asarray(bits, dtype=np.float64) / self.link(round_).up_bps[np.asarray(clients)]
        return PhaseCost(seconds, self.client_power_w * seconds, UPLINK, client_nodes(clients))

    def download(self, clients: np.ndarray, bits: np.ndarray, round_: int) -> PhaseCost:
        """The base station sending ``bits`` to each client (transmit energy at the base station)."""
        seconds = np.asarray(bits, dtype=np.float64) / self.link(round_).down_bps[np.asarray(clients)]
        return PhaseCost(seconds, self.server_power_w * seconds, DOWNLINK, [SERVER] * len(seconds))

    def peer_send(self, clients: np.ndarray, bits: np.ndarray, round_: int) -> PhaseCost:
        """Clients sending ``bits`` each to their peers, one message after another.

        No paper of the decentralized family gives a device-to-device channel; ours (docs/decisions.md,
        "Simulated time of a peer-to-peer round") is each client's own uplink sub-channel at its uplink
        rate and transmit power, so a peer send costs what an upload of the same bits costs. Receiving
        costs the receiver nothing.
        """
        up = self.upload(clients, bits, round_)
        return PhaseCost(up.seconds, up.joules, PEER, up.payers)

    def client_compute(self, flops: np.ndarray, clients: np.ndarray | None = None) -> PhaseCost:
        """Clients ``clients`` executing ``flops`` each on their CPUs (``clients`` may be left out where
        only the seconds are needed)."""
        cfg = self.cfg
        cpu_hz = self.client_cpu_hz(clients)
        seconds = compute_seconds(flops, cfg.cycles_per_flop, cpu_hz)
        joules = compute_energy(flops, cfg.cycles_per_flop, cpu_hz, cfg.kappa)
        return PhaseCost(seconds, joules, CLIENT_COMPUTE, None if clients is None else client_nodes(clients))

    def server_compute(self, flops: np.ndarray | float) -> PhaseCost:
        """The server executing ``flops``: ``server_cpu_hz`` cycles per second, drawing
        ``server_compute_w`` watts while it computes."""
        cfg = self.cfg
        flops = np.atleast_1d(np.asarray(flops, dtype=np.float64))
        seconds = compute_seconds(flops, cfg.cycles_per_flop, cfg.server_cpu_hz)
        return PhaseCost(seconds, cfg.server_compute_w * seconds, SERVER_COMPUTE, [SERVER] * len(seconds))

    def charge(self, cost: RoundCost) -> RoundCost:
        """Advance the clock by one round's ``cost`` (composed by :mod:`fedge.system.rounds`)."""
        self.clock.charge(cost)
        return cost
