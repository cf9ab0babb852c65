"""The round of a synchronous server with a deadline (``fedavg_deadline``): it lasts until the deadline or
the cohort's last arrival, whichever is first, and a client that is not in by then is cut there.

A kept client's job is its download, the share of its local steps it trained (all of them, or with
``late: partial`` the ones it finished in time) and its upload. A dropped client computes until the
round ends and uploads for the airtime left, so its energy is the part of its job inside the round;
the round's path is the last kept client's (the last arrival, if none was kept), and any time after it
the server spent waiting for a deadline nobody else met.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedge.system.clock import WAIT, RoundCost
from fedge.system.model import PhaseCost
from fedge.system.rounds import along, spent


def cutoff(
    finish: np.ndarray, clients: np.ndarray, cohort: int, deadline_s: float | None
) -> tuple[float, np.ndarray]:
    """When the round ends -- the first ``cohort`` arrivals in (jobs done at ``finish``, ties by client),
    or ``deadline_s`` if that is sooner -- and which of the jobs are kept: those of the first ``cohort``
    that are in by then."""
    order = np.lexsort((clients, finish))  # arrival order, ties by client
    end = float(finish[order[min(cohort, len(clients)) - 1]])  # the cohort's last arrival
    if deadline_s is not None:
        end = min(end, deadline_s)
    kept = np.zeros(len(clients), dtype=bool)
    kept[order[:cohort]] = True
    kept &= finish <= end
    return end, kept


def compute_left(phases: tuple[PhaseCost, PhaseCost, PhaseCost], end: float) -> np.ndarray:
    """The seconds each job may compute and still have its upload in by ``end`` (none below zero)."""
    down, _, up = phases
    return np.maximum(end - down.seconds - up.seconds, 0.0)


@dataclass(frozen=True)
class DeadlineRound:
    """The round's cost, the rows of the dropped clients whose upload had begun (``late``) and the
    values of the model each of them got across before the round ended (``carried``)."""

    cost: RoundCost
    late: np.ndarray
    carried: np.ndarray


def deadline_round(
    phases: tuple[PhaseCost, PhaseCost, PhaseCost],
    full: np.ndarray,
    done: np.ndarray,
    kept: np.ndarray,
    end: float,
    values: int,
) -> DeadlineRound:
    """The round ending at ``end`` of jobs whose download, compute and upload are ``phases`` (each client
    training ``full`` samples, of which the kept ones trained ``done``); an upload carries ``values``
    model values."""
    down, compute, up = phases
    computed = np.where(kept, done / np.maximum(full, 1.0), 0.0)
    dropped = ~kept
    cut = np.clip(end - down.seconds, 0.0, compute.seconds)
    computed[dropped] = cut[dropped] / np.maximum(compute.seconds[dropped], 1e-300)
    work = PhaseCost(compute.seconds * computed, compute.joules * computed, compute.phase, compute.payers)
    airtime = np.where(kept, up.seconds, np.clip(end - down.seconds - work.seconds, 0.0, up.seconds))
    sent = PhaseCost(airtime, up.joules * airtime / np.maximum(up.seconds, 1e-300), up.phase, up.payers)
    late = np.flatnonzero(dropped & (airtime > 0))
    carried = np.floor(values * airtime[late] / up.seconds[late]).astype(np.int64)
    ends = down.seconds + work.seconds + sent.seconds
    last = int(np.argmax(np.where(kept, ends, -1.0))) if kept.any() else int(np.argmax(ends))
    path = along(last, down, work, sent)
    gap = end - float(ends[last])
    if gap > 0:
        path[WAIT] = gap  # the server waiting for a deadline nobody else met
    joules = float(down.joules.sum() + work.joules.sum() + sent.joules.sum())
    return DeadlineRound(RoundCost(end, joules, path, spent(down, work, sent)), late, carried)
