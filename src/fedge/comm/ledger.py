"""The ledger: one entry per transfer ``(round, src, dst, kind, bits)`` and storage per node.

Nodes are named as :mod:`fedge.comm.nodes` says. A transfer's direction follows from the levels of its
ends: towards a higher level is *up*, towards a lower level is *down*, between equals (client to
client) is *peer*. Entries are kept as columns so a ledger of millions of transfers
stays small, checkpoints cheaply and exports as CSV.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from fedge.comm.nodes import direction


class RoundTraffic:
    """One round's transfers: bits per sender and per receiver, by direction."""

    def __init__(self, src: list[str], dst: list[str], bits: np.ndarray):
        self._sent: dict[tuple[str, str], int] = defaultdict(int)
        self._received: dict[tuple[str, str], int] = defaultdict(int)
        for s, d, b in zip(src, dst, bits.tolist(), strict=True):
            way = direction(s, d)
            self._sent[(s, way)] += b
            self._received[(d, way)] += b

    def sent(self, nodes: Sequence[str], direction_: str) -> np.ndarray:
        """Bits each of ``nodes`` sent in ``direction_`` (``up``, ``down``, ``peer``) this round."""
        return np.array([self._sent.get((node, direction_), 0) for node in nodes], dtype=np.int64)

    def received(self, nodes: Sequence[str], direction_: str) -> np.ndarray:
        """Bits each of ``nodes`` received in ``direction_`` this round."""
        return np.array([self._received.get((node, direction_), 0) for node in nodes], dtype=np.int64)


class Ledger:
    """Transfers and storage of one run."""

    def __init__(self) -> None:
        self._nodes: list[str] = []
        self._node_ids: dict[str, int] = {}
        self._kinds: list[str] = []
        self._kind_ids: dict[str, int] = {}
        self._columns: dict[str, list[np.ndarray]] = {
            "round": [],
            "src": [],
            "dst": [],
            "kind": [],
            "bits": [],
        }
        self._totals: dict[tuple[str, str], int] = defaultdict(int)
        self.storage: dict[str, dict[str, int]] = defaultdict(dict)
        self._peak: dict[str, int] = {}
        self._count = 0  # transfers recorded (the entries' length, kept so a checkpoint need not add it up)

    def _intern(self, names: Sequence[str], table: list[str], ids: dict[str, int]) -> np.ndarray:
        out = np.empty(len(names), dtype=np.int32)
        for i, name in enumerate(names):
            if name not in ids:
                ids[name] = len(table)
                table.append(name)
            out[i] = ids[name]
        return out

    def record(
        self, round_: int, src: str | Sequence[str], dst: str | Sequence[str], kind: str, bits
    ) -> None:
        """Record transfers of one kind; ``src``/``dst`` are names or lists, ``bits`` per entry."""
        bits = np.atleast_1d(np.asarray(bits, dtype=np.int64))
        count = max(
            len(bits), 1 if isinstance(src, str) else len(src), 1 if isinstance(dst, str) else len(dst)
        )
        srcs = [src] * count if isinstance(src, str) else list(src)
        dsts = [dst] * count if isinstance(dst, str) else list(dst)
        bits = np.broadcast_to(bits, (count,))
        if len(srcs) != count or len(dsts) != count:
            raise ValueError("src, dst and bits must have equal lengths")
        self._columns["round"].append(np.full(count, round_, dtype=np.int32))
        self._columns["src"].append(self._intern(srcs, self._nodes, self._node_ids))
        self._columns["dst"].append(self._intern(dsts, self._nodes, self._node_ids))
        self._columns["kind"].append(self._intern([kind], self._kinds, self._kind_ids).repeat(count))
        self._columns["bits"].append(bits.copy())
        self._count += count
        for s, d, b in zip(srcs, dsts, bits, strict=True):
            self._totals[(kind, direction(s, d))] += int(b)

    def set_storage(self, node: str, kind: str, bits: int) -> None:
        """Set what ``node`` holds of ``kind`` (a model copy, an auxiliary head...) in bits."""
        self.storage[node][kind] = int(bits)
        self._peak[node] = max(self._peak.get(node, 0), sum(self.storage[node].values()))

    def kinds(self) -> list[str]:
        """Every transfer kind recorded so far, in order of first use."""
        return list(self._kinds)

    def nodes(self) -> list[str]:
        """Every node that sent or received something so far, in order of first use."""
        return list(self._nodes)

    def peak_storage(self) -> dict[str, int]:
        """The most each node has held at once, in bits, over the run so far."""
        return dict(self._peak)

    def totals(self) -> dict[tuple[str, str], int]:
        """Cumulative bits by ``(kind, direction)``."""
        return dict(self._totals)

    def total_bits(self, direction_: str | None = None, kinds: Sequence[str] | None = None) -> int:
        """Cumulative bits, optionally restricted to one direction and to some kinds."""
        return sum(
            bits
            for (kind, way), bits in self._totals.items()
            if (direction_ is None or way == direction_) and (kinds is None or kind in kinds)
        )

    def storage_bits(self) -> dict[str, int]:
        """Storage summary: total on non-client nodes and the largest per-client footprint."""
        server = sum(sum(v.values()) for node, v in self.storage.items() if not node.startswith("client"))
        clients = [sum(v.values()) for node, v in self.storage.items() if node.startswith("client")]
        return {"server": server, "client_max": max(clients, default=0)}

    def entries(self) -> dict[str, np.ndarray]:
        """All transfers as columns (node and kind ids resolved by :meth:`to_csv`)."""
        return {
            key: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            for key, parts in self._columns.items()
        }

    def entry_count(self) -> int:
        """How many transfers are recorded so far."""
        return self._count

    def entries_since(self, count: int) -> dict[str, np.ndarray]:
        """The transfers after the first ``count`` as columns (what a checkpoint appends to its history);
        only the latest parts are read, so the cost is that of the new entries."""
        parts, seen = 0, self.entry_count()
        while seen > count:
            parts += 1
            seen -= len(self._columns["round"][-parts])
        if seen != count:
            raise ValueError(f"{count} does not end a recorded batch of transfers")
        return {
            key: np.concatenate(columns[len(columns) - parts :]) if parts else np.zeros(0, dtype=np.int64)
            for key, columns in self._columns.items()
        }

    def round_traffic(self, round_: int) -> RoundTraffic:
        """The transfers of round ``round_`` (what the simulated clock charges). Rounds are recorded in
        order, so only the latest entries are read."""
        src, dst, bits = [], [], []
        columns = self._columns
        for i in range(len(columns["round"]) - 1, -1, -1):
            rounds = columns["round"][i]
            if rounds.size and rounds.max() < round_:
                break
            mine = rounds == round_
            src.append(columns["src"][i][mine])
            dst.append(columns["dst"][i][mine])
            bits.append(columns["bits"][i][mine])
        names = self._nodes
        pick = [[names[k] for k in np.concatenate(ids).tolist()] if ids else [] for ids in (src, dst)]
        return RoundTraffic(pick[0], pick[1], np.concatenate(bits) if bits else np.zeros(0, dtype=np.int64))

    def to_csv(self) -> str:
        """Every transfer as CSV text ``round,src,dst,kind,direction,bits``."""
        columns = self.entries()
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["round", "src", "dst", "kind", "direction", "bits"])
        for r, s, d, k, b in zip(*(columns[c] for c in ("round", "src", "dst", "kind", "bits")), strict=True):
            src, dst = self._nodes[s], self._nodes[d]
            writer.writerow([int(r), src, dst, self._kinds[k], direction(src, dst), int(b)])
        return out.getvalue()

    def state_dict(self, entries: bool = True) -> dict:
        """Everything needed to restore the ledger exactly; without ``entries``, all but the transfers
        (a checkpoint keeps those in its append-only history, :class:`fedge.runner.checkpoint.Journal`)."""
        return {
            "nodes": list(self._nodes),
            "kinds": list(self._kinds),
            **({"columns": self.entries()} if entries else {}),
            "totals": dict(self._totals),
            "storage": {node: dict(v) for node, v in self.storage.items()},
            "peak": dict(self._peak),
        }

    def load_state_dict(self, state: dict) -> None:
        self._nodes = list(state["nodes"])
        self._node_ids = {n: i for i, n in enumerate(self._nodes)}
        self._kinds = list(state["kinds"])
        self._kind_ids = {k: i for i, k in enumerate(self._kinds)}
        self._columns = {key: [np.asarray(col)] for key, col in state["columns"].items()}
        self._count = len(self._columns["round"][0])
        self._totals = defaultdict(int, state["totals"])
        self.storage = defaultdict(dict, {node: dict(v) for node, v in state["storage"].items()})
        self._peak = dict(state["peak"])
