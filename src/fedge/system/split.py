"""Latency and energy of split-learning rounds (SplitFed, FSL_AN, CSE-FSL; lightweight FedSL).

Neither split paper of the CSE-FSL line measures time (CSE-FSL claims asynchrony benefits, Fig. 3, but
reports no times), so :func:`split_round` is our completion, labelled as such: every participant
downloads its models, computes its local steps, sends its smashed data, labels and models, and receives
any returned gradients, one after another on its own sub-channel; participants work in parallel. Server
copies (FSL_MC, FSL_AN) run in parallel, each on its participant's path. One shared server model
(FSL_OC, CSE-FSL) processes every upload in turn, so the round lasts at least its total compute.
:func:`arrival_round` ends a round whose shared server served uploads in the order they arrived (the
queue the algorithm simulated while serving, ``server_order: arrival``).

Lightweight FedSL's Fig. 4 models communication only: :func:`cut_latency` (smashed data up and gradient
down of the slowest client) and :func:`aggregation_latency` (``T_agg``). :func:`light_fedsl_round`
completes it with the clients' and the server copies' compute (our completion) and adds ``T_agg`` in
aggregation rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.system.clock import AGGREGATION, ALIGN, DOWNLINK, SERVER_COMPUTE, WAIT, RoundCost
from fedge.system.model import PhaseCost, SystemModel
from fedge.system.rounds import along, parallel_clients, shared_server, spent, total_joules


@dataclass(frozen=True)
class SplitWork:
    """One split round's work per participant row: its client, the bits it sent and received, and the
    FLOPs its client side and its share of the server computed."""

    clients: np.ndarray
    up_bits: np.ndarray
    down_bits: np.ndarray
    client_flops: np.ndarray
    server_flops: np.ndarray


def _phases(system: SystemModel, round_: int, work: SplitWork) -> tuple[PhaseCost, ...]:
    """Each row's download, client compute and upload, and the server's compute for it."""
    clients = work.clients
    return (
        system.download(clients, work.down_bits, round_),
        system.client_compute(work.client_flops, clients),
        system.upload(clients, work.up_bits, round_),
        system.server_compute(work.server_flops),
    )


def split_round(system: SystemModel, round_: int, work: SplitWork, shared: bool) -> RoundCost:
    """A split round: server copies on each participant's path, or one ``shared`` server model."""
    down, compute, up, server = _phases(system, round_, work)
    if not shared:
        return parallel_clients(down, compute, up, server)
    return shared_server((down, compute, up), server)


def arrival_round(
    system: SystemModel,
    round_: int,
    work: SplitWork,
    unplaced: SplitWork,
    ready: np.ndarray,
    server_free: float,
) -> RoundCost:
    """A shared-server round served in arrival order (``server_order: arrival``).

    ``ready`` is when each row was done with what the algorithm's queue placed (downloads, local steps
    and uploads up to its last upload, queue waits, returned gradients), ``server_free`` when the server
    finished its last job, and ``unplaced`` the work of each row not placed yet (its steps after its last
    upload, the model upload, downloads such as a mid-round broadcast). The round ends when the last row
    is done or the server is, whichever is later; its energy is that of :func:`split_round` (waiting
    costs nothing). On the critical path, a row's own phases and, as ``wait``, the rest of its time
    (queued at the server, served, jitter); a server-bound round is the server's compute and its idling.
    """
    down, compute, up, server = _phases(system, round_, work)
    clients = work.clients
    rest = (
        system.client_compute(unplaced.client_flops, clients).seconds
        + system.upload(clients, unplaced.up_bits, round_).seconds
        + system.download(clients, unplaced.down_bits, round_).seconds
    )
    ends = ready + rest
    last = float(ends.max(initial=0.0))
    seconds = float(max(last, server_free))
    if ends.size and last >= server_free:
        path = along(int(np.argmax(ends)), down, compute, up)
    else:
        path = {SERVER_COMPUTE: float(server.seconds.sum())}
    path[WAIT] = max(seconds - sum(path.values()), 0.0)
    energy = shared_server((down, compute, up), server)
    return RoundCost(seconds, energy.joules, path, energy.joules_by_node)


def aligned_round(
    system: SystemModel, round_: int, cost: RoundCost, flops: float, clients: np.ndarray, bits: np.ndarray
) -> RoundCost:
    """Round ``cost`` followed by FSL-SAGE's alignment (our completion: the paper times no alignment).

    The one server computes ``flops`` (every participant's alignment, one after another: phase
    ``align``), then sends each row of ``clients`` its aligned aux model (``bits``) on its own downlink,
    in parallel; the round lasts that long longer: the alignment's seconds plus the slowest download.
    """
    work = system.server_compute(flops)
    align = PhaseCost(work.seconds, work.joules, ALIGN, work.payers)
    down = system.download(clients, bits, round_)
    align_s, down_s = float(align.seconds.sum()), float(down.seconds.max(initial=0.0))
    path = dict(cost.seconds_by_phase)
    path[ALIGN] = path.get(ALIGN, 0.0) + align_s
    path[DOWNLINK] = path.get(DOWNLINK, 0.0) + down_s
    by_node = {node: dict(phases) for node, phases in cost.joules_by_node.items()}
    for node, phases in spent(align, down).items():
        mine = by_node.setdefault(node, {})
        for phase, joules in phases.items():
            mine[phase] = mine.get(phase, 0.0) + joules
    joules = cost.joules + total_joules(align, down)
    return RoundCost(cost.seconds + align_s + down_s, joules, path, by_node)


def serve_queue(
    arrival: np.ndarray, service: np.ndarray, free: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """One server, first come first served: the order (by arrival, ties by index), each job's start and
    finish time, and when the server is free again (``free``: when it finished its previous job)."""
    order = np.argsort(arrival, kind="stable")
    start, finish = np.zeros(len(arrival)), np.zeros(len(arrival))
    for i in order:
        start[i] = max(free, float(arrival[i]))
        free = start[i] + float(service[i])
        finish[i] = free
    return order, start, finish, free


def cut_latency(
    system: SystemModel,
    round_: int,
    batch: int,
    smashed_values: int,
    p: float,
    value_bits: int = 32,
    label_bits: int = 32,
) -> float:
    """Fig. 4's per-round latency as we read it, in expectation: slowest client's smashed data (a ``1 - p``
    share of ``smashed_values`` per sample) and labels up, plus the gradient of the kept values down."""
    kept = batch * smashed_values * (1.0 - p) * value_bits
    link = system.link(round_)
    return float(((kept + batch * label_bits) / link.up_bps + kept / link.down_bps).max())


def aggregation_latency(system: SystemModel, round_: int, model_bits: float) -> float:
    """``T_agg``: the slowest client-model upload, then the broadcast to the slowest receiver."""
    link = system.link(round_)
    return float(model_bits / link.up_bps.min() + model_bits / link.down_bps.min())


@dataclass(frozen=True)
class LightRound:
    """A lightweight FedSL round on the clock: its cost, Fig. 4's communication latency of the slowest
    client (``comm``), ``T_agg`` (``agg``, 0 outside aggregation rounds) and, served in arrival order,
    the uploads' total queue wait (``wait``)."""

    cost: RoundCost
    comm: float
    agg: float
    wait: float | None


def light_fedsl_round(
    system: SystemModel,
    round_: int,
    work: SplitWork,
    model_bits: tuple[np.ndarray, np.ndarray] | None,
    jitter: np.ndarray | None,
) -> LightRound:
    """A round of lightweight FedSL: every client computes, sends its smashed data and labels, its server
    copy computes, the gradient comes back; clients in parallel (``jitter`` given: the one server
    serves the uploads in arrival order, each arriving ``jitter`` late). With ``model_bits`` (each
    client's model upload and broadcast) the round adds ``T_agg``: the slowest upload, then the slowest
    broadcast."""
    clients = work.clients
    down, compute, up, server = _phases(system, round_, work)
    cost = parallel_clients(compute, up, server, down)
    seconds, joules, path, wait = cost.seconds, cost.joules, cost.seconds_by_phase, None
    if jitter is not None:
        arrival = compute.seconds + up.seconds + jitter
        _, start, finish, _ = serve_queue(arrival, server.seconds, 0.0)
        ends = finish + down.seconds
        seconds = float(ends.max(initial=0.0))
        wait = float((start - arrival).sum())
        row = int(np.argmax(ends))
        path = along(row, compute, up, server, down)
        path[WAIT] = max(seconds - sum(path.values()), 0.0)
    comm = float((up.seconds + down.seconds).max())
    agg, by_node, aggregation = 0.0, spent(compute, up, server, down), []
    if model_bits is not None:
        aggregation = [system.upload(clients, model_bits[0], round_)]
        aggregation.append(system.download(clients, model_bits[1], round_))
        agg = sum(float(phase.seconds.max()) for phase in aggregation)
        joules += sum(float(phase.joules.sum()) for phase in aggregation)
        for phase in aggregation:
            for node, phases in spent(phase).items():
                mine = by_node.setdefault(node, {})
                mine[AGGREGATION] = mine.get(AGGREGATION, 0.0) + sum(phases.values())
        path[AGGREGATION] = agg
    return LightRound(RoundCost(seconds + agg, joules, path, by_node), comm, agg, wait)
