"""Names of the nodes of a system, as the ledger records them.

Clients are ``client:<i>``, edge servers ``edge:<j>``; the split-learning / FedAvg server is ``server``
and the top of a hierarchy is ``cloud``. A transfer's direction follows from the levels of its ends.
"""

from __future__ import annotations

from collections.abc import Iterable

SERVER = "server"
CLOUD = "cloud"
LEVELS = {"client": 0, "edge": 1, "server": 2, "cloud": 3}


def client(index: int) -> str:
    """The node name of client ``index``."""
    return f"client:{int(index)}"


def edge(index: int) -> str:
    """The node name of edge server ``index``."""
    return f"edge:{int(index)}"


def clients(indices: Iterable[int]) -> list[str]:
    """The node names of the clients ``indices``, in order."""
    return [client(i) for i in indices]


def edges(indices: Iterable[int]) -> list[str]:
    """The node names of the edge servers ``indices``, in order."""
    return [edge(j) for j in indices]


def level(node: str) -> int:
    """The tier of ``node``: client 0, edge 1, server 2, cloud 3."""
    return LEVELS[node.split(":")[0]]


def direction(src: str, dst: str) -> str:
    """``up`` (towards a higher tier), ``down`` or ``peer`` (between equals) for a transfer."""
    a, b = level(src), level(dst)
    return "up" if b > a else "down" if b < a else "peer"
