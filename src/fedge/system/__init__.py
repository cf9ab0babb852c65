"""Wireless system model: channels, rates, compute, energy and the simulated clock (NumPy only)."""

from fedge.system.aircomp import (
    aircomp_cost_per_value,
    aircomp_edge_latency,
    aircomp_mse,
    aircomp_receive,
    aircomp_uplink_seconds,
    receive_beamformer,
)
from fedge.system.cells import CellsWork, cells_round
from fedge.system.channel import draw_distances, path_loss_db, rayleigh_power
from fedge.system.clock import PHASES, Clock, RoundCost
from fedge.system.compute import compute_energy, compute_seconds, forward_flops, training_flops
from fedge.system.model import PhaseCost, SystemModel, WirelessLink
from fedge.system.oma import complex_gaussian, db_to_linear, oma_cost_per_value, oma_edge_latency, oma_rates
from fedge.system.partition_opt import greedy_sizes, milp_sizes, size_cap, uniform_sizes
from fedge.system.peer import RoundWork
from fedge.system.rates import dbm_to_watt, shannon_rate
from fedge.system.rounds import Traffic, parallel_clients, peer_round, server_round, shared_server, star_round
from fedge.system.split import (
    LightRound,
    SplitWork,
    aggregation_latency,
    aligned_round,
    arrival_round,
    cut_latency,
    light_fedsl_round,
    split_round,
)

__all__ = [
    "PHASES",
    "CellsWork",
    "Clock",
    "LightRound",
    "PhaseCost",
    "RoundCost",
    "RoundWork",
    "SplitWork",
    "Traffic",
    "aggregation_latency",
    "aligned_round",
    "arrival_round",
    "cells_round",
    "cut_latency",
    "light_fedsl_round",
    "peer_round",
    "server_round",
    "shared_server",
    "split_round",
    "star_round",
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
    "aircomp_cost_per_value",
    "aircomp_edge_latency",
    "aircomp_mse",
    "aircomp_receive",
    "aircomp_uplink_seconds",
    "complex_gaussian",
    "db_to_linear",
    "greedy_sizes",
    "milp_sizes",
    "oma_cost_per_value",
    "oma_edge_latency",
    "oma_rates",
    "receive_beamformer",
    "size_cap",
    "uniform_sizes",
]
