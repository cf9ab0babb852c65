"""The server's side of the message exchange: which node is which client, one exchange of a message
type with a set of clients under a round timeout, and the record of what it carried and how long it took.

A node that does not answer in time, answers with an error, or answers with a payload that fails its
check (:func:`fedge.deploy.wire.check`) is *dropped* for the round: the reason is logged and kept, and
the caller goes on with the replies it has.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedge.comm import nodes
from fedge.deploy.wire import Rejected, Spec, check, from_record, to_record
from fedge.errors import FedgeError
from fedge.tensors import Tensors

log = logging.getLogger("fedge.deploy")
POLL_SECONDS = 0.05
Scalar = int | float | str | bool


@dataclass
class Outgoing:
    """One message to one client: named tensor records (each with its wire dtype) and settings."""

    records: dict[str, tuple[Tensors, np.dtype | None]]
    config: dict[str, Scalar] = field(default_factory=dict)


@dataclass
class Reply:
    """A checked reply: its tensor records, metrics, and the seconds from push to arrival."""

    records: dict[str, Tensors]
    metrics: dict[str, float]
    seconds: float


class GridTransport:
    """Exchanges with the SuperNodes of a run through Flower's Grid.

    ``timings`` gets one row per message and answer (round, message type, client, node id, seconds from
    push to reply, the node's own compute seconds); ``carried`` one row per ArrayRecord sent or received
    (round, source, destination, record name, bytes); ``dropped`` the reason each client dropped out of
    each round.
    """

    def __init__(self, grid: Grid, num_clients: int, timeout: float):
        self.grid = grid
        self.timeout = timeout
        self.num_clients = num_clients
        self.node_of: dict[int, int] = {}
        self.timings: list[dict[str, object]] = []
        self.carried: list[dict[str, object]] = []
        self.dropped: dict[int, dict[int, str]] = {}

    def connect(self, wait: float) -> None:
        """Ask every connected node for its ``partition-id`` until each of the run's clients has one.

        Each node is asked once and its reply collected whenever it comes, so a node that never answers
        (one that died, whose id the SuperLink still lists for a while) holds up no other."""
        deadline = time.monotonic() + wait
        asked: set[int] = set()
        pending: set[str] = set()
        while len(self.node_of) < self.num_clients:
            if time.monotonic() > deadline:
                have = sorted(self.node_of)
                raise FedgeError(f"only clients {have} of {self.num_clients} joined within {wait:.0f} s")
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            if new:
                asked.update(new)
                hello = [Message(RecordDict({}), dst_node_id=n, message_type="query.hello") for n in new]
                pending.update(self.grid.push_messages(hello))
            for reply in self.grid.pull_messages(list(pending)) if pending else ():
                pending.discard(reply.metadata.reply_to_message_id)
                self._register(reply)
            time.sleep(0.5)

    def _register(self, reply: Message) -> None:
        if reply.has_error():
            return
        config = reply.content.config_records["node"]
        client, count = int(config["partition-id"]), int(config["num-partitions"])
        if count != self.num_clients or not 0 <= client < count:
            log.warning("node %s refused: partition %s of %s", reply.metadata.src_node_id, client, count)
            return
        if client in self.node_of:
            log.warning("node %s refused: client %s already has a node", reply.metadata.src_node_id, client)
            return
        self.node_of[client] = reply.metadata.src_node_id

    def exchange(
        self,
        round_: int,
        message_type: str,
        outgoing: dict[int, Outgoing],
        specs: dict[int, dict[str, dict[str, Spec]]],
    ) -> dict[int, Reply]:
        """Send ``outgoing[c]`` to client c's node, wait for the replies up to the round timeout, and
        return the checked ones; every other client is dropped for the round with its reason."""
        messages, client_of = [], {}
        for client, out in outgoing.items():
            if client in self.dropped.get(round_, {}):
                continue
            content = RecordDict(
                {name: to_record(tensors, dtype) for name, (tensors, dtype) in out.records.items()}
            )
            content["config"] = ConfigRecord({"round": round_, "client": client, **out.config})
            node = self.node_of[client]
            message = Message(content, dst_node_id=node, message_type=message_type)
            messages.append(message)
            client_of[id(message)] = client
            for name, record in content.array_records.items():
                self._carry(round_, nodes.SERVER, nodes.client(client), name, record)
        began = time.monotonic()
        ids = list(self.grid.push_messages(messages))
        by_id = {mid: client_of[id(m)] for mid, m in zip(ids, messages, strict=True)}
        answers = self._pull(by_id, began)
        replies: dict[int, Reply] = {}
        for mid, client in by_id.items():
            reply, seconds = answers.get(mid, (None, None))
            reason = self._problem(reply, specs[client])
            if reason is not None:
                self.drop(round_, client, f"{message_type}: {reason}")
                continue
            records = {name: from_record(record) for name, record in reply.content.array_records.items()}
            for name, record in reply.content.array_records.items():
                self._carry(round_, nodes.client(client), nodes.SERVER, name, record)
            metrics = dict(reply.content.metric_records.get("metrics", MetricRecord({})))
            self.timings.append(
                {
                    "round": round_,
                    "message": message_type,
                    "node": nodes.client(client),
                    "node_id": self.node_of[client],
                    "seconds": seconds,
                    "compute_seconds": metrics.get("compute_seconds"),
                }
            )
            replies[client] = Reply(records, metrics, seconds)
        return replies

    def _pull(self, by_id: dict[str, int], began: float) -> dict[str, tuple[Message, float]]:
        """Replies by message id, with their seconds since ``began``, until all came or time ran out."""
        answers: dict[str, tuple[Message, float]] = {}
        while len(answers) < len(by_id) and time.monotonic() - began < self.timeout:
            waiting = [mid for mid in by_id if mid not in answers]
            for reply in self.grid.pull_messages(waiting):
                answers[reply.metadata.reply_to_message_id] = (reply, time.monotonic() - began)
            if len(answers) < len(by_id):
                time.sleep(POLL_SECONDS)
        return answers

    @classmethod
    def _problem(cls, reply: Message | None, specs: dict[str, dict[str, Spec]]) -> str | None:
        """Why a reply is unusable (None: it is fine)."""
        if reply is None:
            return "no reply within the round timeout"
        if reply.has_error():
            return f"error reply {reply.error.code}: {reply.error.reason}"
        return cls.problem(dict(reply.content.array_records), specs)

    @staticmethod
    def problem(records: dict[str, ArrayRecord], specs: dict[str, dict[str, Spec]]) -> str | None:
        """Why a reply's records are unusable: other record names, or an array failing its check."""
        if set(records) != set(specs):
            return f"records {sorted(records)}, expected {sorted(specs)}"
        try:
            for name, spec in specs.items():
                check(records[name], spec)
        except Rejected as error:
            return f"rejected: {error}"
        return None

    def drop(self, round_: int, client: int, reason: str) -> None:
        """Leave ``client`` out of the rest of round ``round_``; log and keep the reason."""
        self.dropped.setdefault(round_, {})[client] = reason
        log.warning("round %d: %s dropped (%s)", round_, nodes.client(client), reason)

    def _carry(self, round_: int, src: str, dst: str, name: str, record: ArrayRecord) -> None:
        self.carried.append(
            {"round": round_, "src": src, "dst": dst, "kind": name, "bytes": record.count_bytes()}
        )


class Transport(Protocol):
    """What a deployed round needs of the network (:class:`fedge.deploy.transport.GridTransport`)."""

    dropped: dict[int, dict[int, str]]

    def drop(self, round_: int, client: int, reason: str) -> None: ...

    def exchange(
        self, round_: int, message_type: str, outgoing: dict[int, Outgoing], specs: dict[int, Any]
    ) -> dict[int, Reply]: ...


def dropout_figures(transport: Transport, t: int) -> dict[str, Any]:
    """The metrics fields of round t's dropouts: how many, and which nodes."""
    lost = sorted(transport.dropped.get(t, {}))
    return {"dropped": len(lost), "dropped_nodes": [nodes.client(c) for c in lost]}
