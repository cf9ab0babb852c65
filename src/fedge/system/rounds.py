"""How a round's phases compose into its latency and energy: the rules every family shares.

An algorithm reports its round's work (FLOPs per participant) and which rule applies; the bits come
from what the links carried (the round's :class:`Traffic`, read off the ledger). Each rule returns a
:class:`~fedge.system.clock.RoundCost`: the totals exactly as the rule defines them, the seconds along
the critical path by phase and the joules by node and phase. Energy is always the sum of everything
spent; only the latency depends on the rule:

- :func:`parallel_clients`: each participant runs its phases one after another, participants in
  parallel on their own sub-channels; the slowest participant's path is the critical one.
- :func:`shared_server`: the same, plus one server model that serves every upload in turn; the round
  lasts at least the server's total compute (then that is the critical path).
- :func:`star_round`: FedAvg's download, local training, upload; :func:`peer_round`: compute, then peer
  sends; :func:`server_round`: the server alone (centralized training).

The split family's rules (server copies, arrival queue, lightweight FedSL) are in
:mod:`fedge.system.split`, the hierarchical cells' in :mod:`fedge.system.cells`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fedge.system.clock import SERVER_COMPUTE, RoundCost, client_nodes
from fedge.system.model import PhaseCost, SystemModel


class Traffic(Protocol):
    """One round's transfers as the links carried them (the ledger's entries of the round)."""

    def sent(self, nodes: Sequence[str], direction_: str) -> np.ndarray:
        """Bits each of ``nodes`` sent in ``direction_`` (``up``, ``down``, ``peer``)."""
        ...

    def received(self, nodes: Sequence[str], direction_: str) -> np.ndarray:
        """Bits each of ``nodes`` received in ``direction_``."""
        ...


def spent(*phases: PhaseCost) -> dict[str, dict[str, float]]:
    """Joules of ``phases`` by the node that spends them, then by phase."""
    out: dict[str, dict[str, float]] = {}
    for phase in phases:
        if phase.payers is None:
            raise ValueError(f"{phase.phase}: no node named to charge")
        for node, joules in zip(phase.payers, phase.joules.tolist(), strict=True):
            mine = out.setdefault(node, {})
            mine[phase.phase] = mine.get(phase.phase, 0.0) + joules
    return out


def along(row: int, *phases: PhaseCost) -> dict[str, float]:
    """The seconds of participant ``row``'s ``phases``, by phase: its path through the round."""
    out: dict[str, float] = {}
    for phase in phases:
        out[phase.phase] = out.get(phase.phase, 0.0) + float(phase.seconds[row])
    return out


def total_joules(*phases: PhaseCost) -> float:
    """Every phase's joules, summed."""
    return float(sum(phase.joules.sum() for phase in phases))


def parallel_clients(*phases: PhaseCost) -> RoundCost:
    """Participants run ``phases`` one after another, in parallel with each other.

    Latency is the slowest participant's sum over its phases (max over parallel participants, sum over
    sequential steps), and that participant's phases are the critical path; energy is the sum over
    everything.
    """
    per_client = np.sum([phase.seconds for phase in phases], axis=0)
    seconds = float(per_client.max(initial=0.0))
    path = along(int(np.argmax(per_client)), *phases) if per_client.size else {}
    return RoundCost(seconds, total_joules(*phases), path, spent(*phases))


def shared_server(path: Sequence[PhaseCost], server: PhaseCost) -> RoundCost:
    """Participants run ``path`` in parallel while one server model serves each of them in turn.

    The round lasts the slowest participant's path or the server's total compute, whichever is longer
    (the critical path is then the server's compute); energy is the sum over everything.
    """
    clients = parallel_clients(*path)
    busy = float(server.seconds.sum())
    seconds = max(clients.seconds, busy)
    critical = clients.seconds_by_phase if clients.seconds >= busy else {SERVER_COMPUTE: busy}
    joules = clients.joules + float(server.joules.sum())
    return RoundCost(seconds, joules, critical, spent(*path, server))


def star_round(
    system: SystemModel, round_: int, clients: np.ndarray, flops: np.ndarray, traffic: Traffic
) -> RoundCost:
    """Clients download what the server sent them, compute ``flops`` each and upload, in parallel
    (FedAvg); the bits each way are those the round's traffic carried."""
    names = client_nodes(clients)
    return parallel_clients(
        system.download(clients, traffic.received(names, "down"), round_),
        system.client_compute(flops, clients),
        system.upload(clients, traffic.sent(names, "up"), round_),
    )


def peer_round(system: SystemModel, round_: int, flops: np.ndarray, traffic: Traffic) -> RoundCost:
    """Every client computes ``flops[i]``, then sends its peer messages one after another on its own
    uplink (receiving is free); clients in parallel.

    No paper of the decentralized family gives a system model; this is our completion
    (docs/decisions.md, "Simulated time of a peer-to-peer round"). The bits a client sends are the
    round's peer traffic from it.
    """
    clients = np.arange(len(flops))
    sent = traffic.sent(client_nodes(clients), "peer")
    return parallel_clients(
        system.client_compute(flops, clients), system.peer_send(clients, sent, round_)
    )


def server_round(system: SystemModel, flops: float) -> RoundCost:
    """The server alone computes ``flops`` (centralized training): its compute is the round."""
    work = system.server_compute(flops)
    seconds = float(work.seconds.sum())
    return RoundCost(seconds, float(work.joules.sum()), {SERVER_COMPUTE: seconds}, spent(work))
