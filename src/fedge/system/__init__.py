"""Wireless system model: channels, rates, compute, energy and the simulated clock (NumPy only)."""

from fedge.system.channel import draw_distances, path_loss_db, rayleigh_power
from fedge.system.clock import Clock
from fedge.system.compute import compute_energy, compute_seconds, forward_flops, training_flops
from fedge.system.model import PhaseCost, SystemModel, WirelessLink, parallel_clients
from fedge.system.rates import dbm_to_watt, shannon_rate

__all__ = [
    "Clock",
    "PhaseCost",
    "SystemModel",
    "WirelessLink",
    "compute_energy",
    "compute_seconds",
    "dbm_to_watt",
    "draw_distances",
    "forward_flops",
    "path_loss_db",
    "rayleigh_power",
    "parallel_clients",
    "shannon_rate",
    "training_flops",
]
