"""The simulated clock: cumulative seconds and joules of a run, with their breakdown.

Besides the totals the clock keeps where they went: seconds by phase along each round's critical path
(the phases of the participant, cell or server that set the round's latency), and joules by node and
phase (every node's own spending). Joules by phase and by tier (clients, edge servers, server, cloud)
follow from the per-node figures. The system model (:mod:`fedge.system.rounds`) composes each round's
:class:`RoundCost`; nothing else moves the clock.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

# the phases of a round, named once
CLIENT_COMPUTE = "client_compute"  # local training (and probes) on the clients' processors
UPLINK = "uplink"  # clients (or their cells) sending to the server / edge server
DOWNLINK = "downlink"  # the server / base station sending to clients
SERVER_COMPUTE = "server_compute"  # the server's part of a split model, or centralized training
PEER = "peer"  # clients sending to clients
WAIT = "wait"  # a participant idle on the critical path: queued at a shared server, arrival jitter
AGGREGATION = "aggregation"  # lightweight FedSL's model upload and broadcast every I rounds (T_agg)
ALIGN = "align"  # FSL-SAGE's server fitting the clients' aux models to its own cut-layer gradients
PHASES = (CLIENT_COMPUTE, DOWNLINK, UPLINK, PEER, SERVER_COMPUTE, WAIT, AGGREGATION, ALIGN)

# node names as the ledger writes them (fedge.comm.nodes, a layer above this one), by tier
TIERS = ("client", "edge", "server", "cloud")
SERVER = "server"


def client_nodes(clients: np.ndarray | list[int]) -> list[str]:
    """The node names of clients ``clients`` (``client:<i>``)."""
    return [f"client:{int(i)}" for i in np.asarray(clients).reshape(-1)]


def tier(node: str) -> str:
    """The tier of a node name: ``client``, ``edge``, ``server`` or ``cloud``."""
    name = node.split(":")[0]
    if name not in TIERS:
        raise ValueError(f"unknown node {node!r}")
    return name


@dataclass(frozen=True)
class RoundCost:
    """One round's simulated cost: its latency and energy, and their breakdown.

    ``seconds`` and ``joules`` are the totals as the composition rule gives them; ``seconds_by_phase``
    splits ``seconds`` along the critical path and ``joules_by_node`` splits ``joules`` by the node that
    spends them and phase (each adds up to its total within rounding).
    """

    seconds: float
    joules: float
    seconds_by_phase: dict[str, float]
    joules_by_node: dict[str, dict[str, float]]


@dataclass
class Clock:
    """Simulated time and energy so far, and their breakdown by phase and by node."""

    seconds: float = 0.0
    joules: float = 0.0
    seconds_by_phase: dict[str, float] = field(default_factory=dict)
    joules_by_node: dict[str, dict[str, float]] = field(default_factory=dict)

    def charge(self, cost: RoundCost) -> None:
        """Add one round's cost."""
        self.seconds += float(cost.seconds)
        self.joules += float(cost.joules)
        for phase, seconds in cost.seconds_by_phase.items():
            self.seconds_by_phase[phase] = self.seconds_by_phase.get(phase, 0.0) + float(seconds)
        for node, phases in cost.joules_by_node.items():
            mine = self.joules_by_node.setdefault(node, {})
            for phase, joules in phases.items():
                mine[phase] = mine.get(phase, 0.0) + float(joules)

    def joules_by_phase(self) -> dict[str, float]:
        """Joules so far per phase, over every node."""
        out: dict[str, float] = defaultdict(float)
        for phases in self.joules_by_node.values():
            for phase, joules in phases.items():
                out[phase] += joules
        return _ordered(out)

    def joules_by_tier(self) -> dict[str, float]:
        """Joules so far per tier (``client``, ``edge``, ``server``, ``cloud``), over its nodes."""
        out: dict[str, float] = defaultdict(float)
        for node, phases in self.joules_by_node.items():
            out[tier(node)] += sum(phases.values())
        return {name: out[name] for name in TIERS if name in out}

    def node_joules(self) -> dict[str, float]:
        """Joules so far per node."""
        return {node: sum(phases.values()) for node, phases in self.joules_by_node.items()}

    def top_nodes(self, count: int) -> dict[str, float]:
        """The ``count`` nodes that spent the most joules so far, most first (ties by name)."""
        spent = self.node_joules()
        return {node: spent[node] for node in sorted(spent, key=lambda n: (-spent[n], n))[:count]}

    def to_csv(self) -> str:
        """Every node's joules so far as CSV text ``node,tier,joules,<phase>...`` (most first)."""
        phases = list(self.joules_by_phase())
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["node", "tier", "joules", *phases])
        for node, joules in self.top_nodes(len(self.joules_by_node)).items():
            mine = self.joules_by_node[node]
            writer.writerow([node, tier(node), repr(joules), *(repr(mine.get(p, 0.0)) for p in phases)])
        return out.getvalue()

    def breakdown(self) -> dict[str, dict[str, float]]:
        """The cumulative breakdown a metrics row carries: seconds and joules by phase, joules by tier."""
        return {
            "sim_seconds_by_phase": _ordered(self.seconds_by_phase),
            "sim_joules_by_phase": self.joules_by_phase(),
            "sim_joules_by_tier": self.joules_by_tier(),
        }

    def state_dict(self) -> dict:
        return {
            "seconds": self.seconds,
            "joules": self.joules,
            "seconds_by_phase": dict(self.seconds_by_phase),
            "joules_by_node": {node: dict(phases) for node, phases in self.joules_by_node.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a clock; a checkpoint from before the breakdown restores the totals only."""
        self.seconds, self.joules = float(state["seconds"]), float(state["joules"])
        self.seconds_by_phase = {k: float(v) for k, v in state.get("seconds_by_phase", {}).items()}
        self.joules_by_node = {
            node: {k: float(v) for k, v in phases.items()}
            for node, phases in state.get("joules_by_node", {}).items()
        }


def _ordered(figures: dict[str, float]) -> dict[str, float]:
    """``figures`` in the order of :data:`PHASES` (unknown phases last, by name)."""
    rank = {phase: i for i, phase in enumerate(PHASES)}
    return {k: figures[k] for k in sorted(figures, key=lambda k: (rank.get(k, len(rank)), k))}
