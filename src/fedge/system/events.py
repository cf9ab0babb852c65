"""The event queue of an asynchronous run: clients' updates arriving at their own simulated times.

Each entry is one client's job: dispatched at ``start`` with model ``version``, its update arriving
at ``time``. The queue pops in order of arrival time, ties in order of dispatch (``seq``), so the same
jobs always come out in the same order, whatever the executor and however the run was interrupted: the
queue's state (its entries and the next sequence number) is part of the checkpoint.
"""

from __future__ import annotations

import heapq
from dataclasses import astuple, dataclass, field


@dataclass(frozen=True, order=True)
class Job:
    """A client's job: it started from model ``version`` at ``start`` and its update arrives at ``time``."""

    time: float
    seq: int
    client: int = field(compare=False)
    version: int = field(compare=False)
    start: float = field(compare=False)


class EventQueue:
    """Jobs in flight, popped by ``(arrival time, dispatch order)``."""

    def __init__(self) -> None:
        self._heap: list[Job] = []
        self.next_seq = 0

    def push(self, time: float, client: int, version: int, start: float) -> Job:
        """Dispatch a job; it gets the next sequence number."""
        job = Job(float(time), self.next_seq, int(client), int(version), float(start))
        self.next_seq += 1
        heapq.heappush(self._heap, job)
        return job

    def pop(self) -> Job:
        """The job that arrives next."""
        return heapq.heappop(self._heap)

    def peek(self) -> Job:
        return self._heap[0]

    def __len__(self) -> int:
        return len(self._heap)

    def clients(self) -> set[int]:
        """The clients with a job in flight."""
        return {job.client for job in self._heap}

    def jobs(self) -> list[Job]:
        """Every job in flight, in arrival order."""
        return sorted(self._heap)

    def state_dict(self) -> dict:
        return {"jobs": [list(astuple(job)) for job in self.jobs()], "next_seq": self.next_seq}

    def load_state_dict(self, state: dict) -> None:
        jobs = [
            Job(float(t), int(seq), int(client), int(version), float(start))
            for t, seq, client, version, start in state["jobs"]
        ]
        self._heap = sorted(jobs)  # a sorted list is a heap
        self.next_seq = int(state["next_seq"])
