"""The asynchronous engine: one event loop for every server whose clients work on their own simulated time.

FedBuff, FedAsync and asynchronous CSE-FSL differ in what a dispatched client does and in how the server
merges what arrives; the loop around that is the same, and :class:`AsyncEngine` owns it. The server keeps
``policy.concurrency`` clients at work. A **dispatch** hands a group of idle online clients to the
policy, which trains them and returns each client's messages (:class:`Dispatch`: its smashed-data
uploads, say, and its final update); every message becomes an :class:`Event` at the simulated time it
reaches the server, in a queue ordered by ``(time, seq)`` (ties in dispatch order). A round of the
runner is one merge: the engine takes events in that order until the policy is **due**; a client's final
message is an **arrival** (its upload goes through the link, its energy on the clock), any other message
is served by the policy at once; the places freed are **refilled** with the model the server has, once
every arrival of the same instant is in. The merge then closes the round on the clock by the critical
path rule of :mod:`fedge.system.arrivals`, and the merged clients hold the new model.

The engine's state (the events in flight, the arrivals not merged yet, the clock and draw counters) is
part of the checkpoint, so an interrupted run resumes to the numbers of an uninterrupted one.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from fedge.aggregation import sites
from fedge.comm import Link, nodes
from fedge.runtime.availability import draw_clients, idle_online
from fedge.runtime.context import Context
from fedge.system import RoundCost
from fedge.system.arrivals import job_energy, round_path
from fedge.tensors import Tensors


@dataclass(frozen=True)
class Dispatch:
    """One message of a dispatched client's job, as the policy hands it to the engine: it reaches the
    server ``after`` seconds from the dispatch and carries the policy's ``payload`` (a frozen dataclass).

    ``final``: the job's last message (its client is free once it arrives); ``upload``: what the client
    sends the server with it (through the engine's link, on arrival); ``seconds`` / ``joules``: the
    job's download, compute and upload, for the round's critical path and the energy charged on arrival
    (none: the group's energy is charged at dispatch, :attr:`Dispatched.energy`)."""

    client: int
    after: float
    payload: Any
    final: bool = True
    upload: Tensors | None = None
    seconds: tuple[float, ...] = ()
    joules: tuple[float, ...] = ()


@dataclass(frozen=True)
class Dispatched:
    """What a dispatched group sends, in the order it sends it, and the energy its jobs cost at once
    (a split job's, whose cut traffic is over before its update arrives)."""

    messages: list[Dispatch]
    energy: RoundCost | None = None


@dataclass(frozen=True, order=True)
class Event:
    """A message in flight: dispatched at ``start`` with model ``version``, it arrives at ``time``."""

    time: float
    seq: int
    version: int = field(compare=False)
    start: float = field(compare=False)
    message: Dispatch = field(compare=False)

    @property
    def client(self) -> int:
        """The client that sent the message."""
        return self.message.client


@dataclass(frozen=True)
class Arrival:
    """A client's final message as the server received it (``received``: its upload, decoded)."""

    event: Event
    received: Tensors | None

    @property
    def client(self) -> int:
        """The client whose update arrived."""
        return self.event.client

    @property
    def version(self) -> int:
        """The model version the client trained from."""
        return self.event.version

    @property
    def seq(self) -> int:
        """The arrival's place in dispatch order."""
        return self.event.seq

    @property
    def payload(self) -> Any:
        """The policy's record of the update."""
        return self.event.message.payload


class AsyncPolicy(Protocol):
    """What makes an asynchronous algorithm of the engine: how many clients it keeps at work, what a
    dispatched group does, when it merges and how."""

    concurrency: int

    def due(self, arrived: int) -> bool:
        """Whether ``arrived`` arrivals are to be merged now."""
        ...

    def dispatch(self, t: int, clients: np.ndarray, version: int) -> Dispatched:
        """``clients`` receive the model of ``version`` in round ``t`` and do their job."""
        ...

    def serve(self, t: int, event: Event) -> None:
        """A message that is not a client's last reaches the server (a smashed-data upload)."""
        ...

    def aggregate(self, t: int, arrivals: list[Arrival]) -> None:
        """Merge ``arrivals`` (in dispatch order) into the model."""
        ...

    def server_free(self) -> float | None:
        """When the server is done with what it took (the merge waits for it), or None: no backlog."""
        ...

    def stored(self) -> Tensors | None:
        """The model the server and the merged clients hold, or None where the policy stores its own."""
        ...


class AsyncEngine:
    """The event loop of ``policy``; its clients' final uploads go through ``up`` (if any)."""

    def __init__(self, ctx: Context, policy: AsyncPolicy, payloads: Sequence[type], up: Link | None = None):
        self.ctx, self.policy, self.up = ctx, policy, up
        self.payloads = {kind.__name__: kind for kind in payloads}  # the payload classes, for resuming
        self.version = 0  # merges so far
        self.now = 0.0  # the server's simulated time
        self.draws = 0  # availability draws so far (one per dispatch)
        self.refills = 0  # dispatches at the current version
        self.next_seq = 0
        self.events: list[Event] = []  # a heap by (time, seq)
        self.arrived: list[Arrival] = []  # final messages received, not merged yet
        held = policy.stored()
        if held is not None:
            ctx.network.hold(nodes.SERVER, "model", held)

    @property
    def in_flight(self) -> int:
        """Clients at work (their final message not arrived yet)."""
        return len(self.working())

    def working(self) -> set[int]:
        """The clients at work."""
        return {event.client for event in self.events if event.message.final}

    @property
    def dispatch_key(self) -> tuple[int, int]:
        """The key of the dispatch under way: the version its model becomes and its place among that
        version's dispatches (1, 2...); unique over the run, the same on a resumed one."""
        return self.version + 1, self.refills

    # --- dispatch and refill --------------------------------------------------------------------------

    def refill(self, t: int) -> None:
        """Dispatch the current model to as many idle online clients as there are free places."""
        working = self.working()
        free = self.policy.concurrency - len(working)
        if free <= 0:
            return
        self.draws += 1
        busy = working | {arrival.client for arrival in self.arrived}
        pool = idle_online(self.ctx.system, self.draws, busy)
        keys = (self.version + 1,) if self.refills == 0 else (self.version + 1, self.refills)
        clients = draw_clients(self.ctx.seed, pool, free, *keys)
        if len(clients):
            self.refills += 1
            self.dispatch(t, clients)

    def dispatch(self, t: int, clients: np.ndarray) -> None:
        """The policy's job for ``clients`` in round ``t``; its messages go in flight."""
        group = self.policy.dispatch(t, clients, self.version)
        if group.energy is not None:
            self.ctx.system.charge(group.energy)
        for message in group.messages:
            event = Event(self.now + message.after, self.next_seq, self.version, self.now, message)
            self.next_seq += 1
            heapq.heappush(self.events, event)

    # --- arrivals and the round -----------------------------------------------------------------------

    def arrive(self, t: int, event: Event) -> None:
        """A client's final message reaches the server: its upload on the ledger (unless the buffer's
        reducer records the upload itself: :meth:`~fedge.runtime.context.Context.records_upload`), its
        energy on the clock, and the arrival kept for the merge."""
        message, received = event.message, None
        if message.upload is not None and self.up is not None:
            sender, record = nodes.client(message.client), self.ctx.records_upload(sites.BUFFER)
            sent = self.up.send(t, sender, nodes.SERVER, "model_up", message.upload, record=record)
            received = sent.payload
        if message.joules:
            self.ctx.system.charge(job_energy(message.client, message.joules))
        self.arrived.append(Arrival(event, received))

    def run_round(self, t: int) -> list[Arrival]:
        """Round ``t``: events in order until the policy merges; the arrivals merged, in dispatch order
        (none: nobody at work and nobody could be dispatched, the model and the clock as they were)."""
        began = self.now
        policy = self.policy
        self.refill(t)
        while not policy.due(len(self.arrived)):
            if not self.events:
                if self.arrived:
                    break  # nobody left at work: merge what came
                return []
            event = heapq.heappop(self.events)
            self.now = max(self.now, event.time)
            if not event.message.final:
                policy.serve(t, event)
                continue
            self.arrive(t, event)
            instant = bool(self.events) and self.events[0].time == event.time
            if not policy.due(len(self.arrived)) and not instant:
                self.refill(t)  # the freed places, once every arrival of this instant is in
        closing = self.arrived[-1].event  # the arrival that closed the round
        arrivals = sorted(self.arrived, key=lambda a: a.seq)
        self.arrived = []
        policy.aggregate(t, arrivals)
        self.version += 1
        self.refills = 0
        free = policy.server_free()
        if free is not None:
            self.now = max(self.now, free)  # the merge waits for the server's backlog
        message = closing.message
        cost = round_path(began, self.now, closing.start, closing.time, message.seconds, free is not None)
        self.ctx.system.charge(cost)
        held = policy.stored()
        if held is not None:
            self.ctx.network.hold(nodes.clients([a.client for a in arrivals]), "model", held)
        return arrivals

    # --- checkpoint -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "now": self.now,
            "draws": self.draws,
            "refills": self.refills,
            "next_seq": self.next_seq,
            "events": [_saved_event(event) for event in sorted(self.events)],
            "arrived": [{"event": _saved_event(a.event), "received": a.received} for a in self.arrived],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version, self.now = int(state["version"]), float(state["now"])
        self.draws, self.refills = int(state["draws"]), int(state["refills"])
        self.next_seq = int(state["next_seq"])
        self.events = [self._event(saved) for saved in state["events"]]  # a sorted list is a heap
        self.arrived = [Arrival(self._event(a["event"]), a["received"]) for a in state["arrived"]]

    def _event(self, saved: dict[str, Any]) -> Event:
        message = saved["message"]
        payload = self.payloads[message["kind"]](**message["payload"])
        dispatch = Dispatch(
            int(message["client"]),
            float(message["after"]),
            payload,
            bool(message["final"]),
            message["upload"],
            tuple(float(s) for s in message["seconds"]),
            tuple(float(j) for j in message["joules"]),
        )
        time, seq, version, start = saved["time"], saved["seq"], saved["version"], saved["start"]
        return Event(float(time), int(seq), int(version), float(start), dispatch)


def _saved_event(event: Event) -> dict[str, Any]:
    """An event as checkpointable values (its payload by its class name and fields)."""
    message = event.message
    payload = {f.name: getattr(message.payload, f.name) for f in fields(message.payload)}
    saved = {f.name: getattr(message, f.name) for f in fields(message) if f.name != "payload"}
    saved.update(kind=type(message.payload).__name__, payload=payload, seconds=list(message.seconds))
    saved["joules"] = list(message.joules)
    return {"time": event.time, "seq": event.seq, "version": event.version, "start": event.start,
            "message": saved}  # fmt: skip


__all__ = ["Arrival", "AsyncEngine", "AsyncPolicy", "Dispatch", "Dispatched", "Event"]
