"""An in-process stand-in for the SuperNodes: the remote executor's messages go through the same
ArrayRecords, node code and reply checks as on Flower's runtime, without its processes.

It tests a deployed round's numbers and its dropout rule in seconds (the runtime tests take minutes),
and shows where a deployed run differs from a simulated one: only in what crosses the transport.
"""

from __future__ import annotations

import time

from fedge.comm import nodes
from fedge.config import RunConfig
from fedge.deploy.executor import MESSAGE
from fedge.deploy.node import Node
from fedge.deploy.transport import GridTransport, Outgoing, Reply
from fedge.deploy.wire import from_record, to_record
from fedge.errors import FedgeError


class LoopbackTransport(GridTransport):
    """Client c's node is a :class:`~fedge.deploy.node.Node` in this process (node id ``c + 1``);
    the clients in ``silent`` never reply from round ``silent_from`` on (a node lost mid-run)."""

    def __init__(self, config: RunConfig, num_clients: int, silent: frozenset[int] = frozenset(),
                 silent_from: int = 1):  # fmt: skip
        super().__init__(None, num_clients, timeout=0.0)
        self.config = config
        self.silent, self.silent_from = silent, silent_from
        self.node_of = {c: c + 1 for c in range(num_clients)}
        self._nodes: dict[int, Node] = {}

    def node(self, client: int) -> Node:
        if client not in self._nodes:
            self._nodes[client] = Node(self.config, client)
        return self._nodes[client]

    def exchange(self, round_: int, message_type: str, outgoing: dict[int, Outgoing], specs: dict) -> dict:
        if message_type != MESSAGE:
            raise FedgeError(f"the loopback transport carries {MESSAGE} only, not {message_type}")
        replies: dict[int, Reply] = {}
        for client, out in outgoing.items():
            if client in self.dropped.get(round_, {}):
                continue
            sent = {name: to_record(t, dtype) for name, (t, dtype) in out.records.items()}
            for name, record in sent.items():
                self._carry(round_, nodes.SERVER, nodes.client(client), name, record)
            if client in self.silent and round_ >= self.silent_from:
                self.drop(round_, client, f"{message_type}: no reply within the round timeout")
                continue
            began = time.monotonic()
            config = {"round": round_, "client": client, **out.config}
            records, metrics = self.node(client).train_rows(
                {name: from_record(r) for name, r in sent.items()}, config
            )
            back = {name: to_record(t) for name, t in records.items()}
            reason = self.problem(back, specs[client])
            if reason is not None:
                self.drop(round_, client, f"{message_type}: {reason}")
                continue
            for name, record in back.items():
                self._carry(round_, nodes.client(client), nodes.SERVER, name, record)
            seconds = time.monotonic() - began
            self.timings.append(
                {"round": round_, "message": message_type, "node": nodes.client(client),
                 "node_id": self.node_of[client], "seconds": seconds,
                 "compute_seconds": metrics["compute_seconds"]}
            )  # fmt: skip
            replies[client] = Reply({n: from_record(r) for n, r in back.items()}, metrics, seconds)
        return replies
