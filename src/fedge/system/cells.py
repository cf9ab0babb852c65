"""Latency and energy of a hierarchical round (HIST, HFedAvg): cells of clients under edge servers.

Latency is HIST's: every cell runs ``E`` edge rounds in parallel with the others, and an edge round
lasts until its slowest client has computed its ``H`` local steps and uploaded, by TDMA under OMA
(Eq. 17: ``max_i [H (d_j/d) V_0 / F_i + n_j bits / R_i]``) or all at once over the air under AirComp
(Eq. 35: the slowest client's compute plus the analog OFDM uplink); the global round is ``E`` times
the slowest cell's edge round (Eq. 18). Edge, cloud and downlink delays are neglected, as the paper
assumes; so the critical path is the slowest cell's slowest client, its compute and uplink.

Energy, which HIST does not model, counts the same client-side work: ``E`` edge rounds of every client's
local steps (``kappa F_i^2`` per cycle) and its uplink airtime at the clients' transmit power, a
client's own upload time ``bits / R_i`` under OMA (the TDMA wait costs no energy) and the whole analog
uplink under AirComp, where all clients transmit at once. The transmit power and ``kappa`` are the
``system`` block's (HIST's SNRs fold the power into the channel, so the paper gives no wattage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedge.system.aircomp import aircomp_compute_seconds, aircomp_edge_latency, aircomp_uplink_seconds
from fedge.system.clock import CLIENT_COMPUTE, UPLINK, RoundCost, client_nodes
from fedge.system.compute import compute_energy
from fedge.system.model import SystemModel
from fedge.system.oma import global_round_latency, oma_edge_latency, oma_edge_phases


class RadioTiming(Protocol):
    """The cells' radio and compute constants (HIST Sec. VI-C)."""

    cycles_per_step: float
    subcarrier_hz: float
    symbol_s: float


@dataclass(frozen=True)
class CellsWork:
    """What the cells did in one global round: each cell's clients, the model values it trains (of
    ``model_values``), the clients' processor speeds, the bits one client of each cell uploads per edge
    round (OMA), ``edge_rounds`` edge rounds of ``steps`` local steps, and each cell's AirComp band."""

    members: list[np.ndarray]
    values: np.ndarray
    model_values: int
    cpu_hz: np.ndarray
    upload_bits: np.ndarray
    edge_rounds: int
    steps: int
    bandwidth_hz: np.ndarray


def _latency(work: CellsWork, radio: RadioTiming, rates: np.ndarray | None) -> tuple[float, dict[str, float]]:
    """The global round's seconds (Eq. 17-18 with OMA ``rates``, Eq. 35 for AirComp) and, by phase, the
    path of the slowest cell's slowest client."""
    per_cell, paths = [], []
    for j, members in enumerate(work.members):
        fraction = work.values[j] / work.model_values
        cpu = work.cpu_hz[members]
        if rates is not None:
            timing = (work.steps, fraction, radio.cycles_per_step, cpu, work.upload_bits[j], rates[members])
            per_cell.append(oma_edge_latency(*timing))
            compute, upload = oma_edge_phases(*timing)
            slowest = int(np.argmax(compute + upload))
            paths.append((float(compute[slowest]), float(upload[slowest])))
        else:
            air = (work.values[j], float(work.bandwidth_hz[j]), radio.subcarrier_hz, radio.symbol_s)
            per_cell.append(aircomp_edge_latency(work.steps, fraction, radio.cycles_per_step, cpu, *air))
            seconds = aircomp_compute_seconds(work.steps, fraction, radio.cycles_per_step, cpu)
            paths.append((float(seconds), aircomp_uplink_seconds(*air)))
    slowest_compute, slowest_upload = paths[int(np.argmax(per_cell))]
    e = work.edge_rounds
    path = {CLIENT_COMPUTE: e * slowest_compute, UPLINK: e * slowest_upload}
    return global_round_latency(np.array(per_cell), e), path


def cells_round(
    system: SystemModel, work: CellsWork, radio: RadioTiming, rates: np.ndarray | None
) -> RoundCost:
    """One global round of the cells: OMA with each client's uplink ``rates``, AirComp for None."""
    seconds, path = _latency(work, radio, rates)
    power, kappa, e = system.client_power_w, system.cfg.kappa, work.edge_rounds
    joules, by_node = 0.0, {}
    for j, members in enumerate(work.members):
        cycles = work.steps * work.values[j] / work.model_values * radio.cycles_per_step
        compute = compute_energy(cycles, 1.0, work.cpu_hz[members], kappa)
        if rates is not None:
            airtime = work.upload_bits[j] / rates[members]
        else:
            air = (work.values[j], float(work.bandwidth_hz[j]), radio.subcarrier_hz, radio.symbol_s)
            airtime = np.full(len(members), aircomp_uplink_seconds(*air))
        joules += float(compute.sum() + power * airtime.sum())
        for node, c, a in zip(client_nodes(members), compute.tolist(), airtime.tolist(), strict=True):
            by_node[node] = {CLIENT_COMPUTE: e * c, UPLINK: e * power * a}
    return RoundCost(seconds, e * joules, path, by_node)
