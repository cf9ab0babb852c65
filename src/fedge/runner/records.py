"""What every round records beyond its metrics, and what a summary says about the ledger.

Every round, evaluated or not, writes one row to ``metrics.jsonl``; these are its cost fields that the
ledger alone gives: cumulative bits per link (direction) and kind, and what each node stores now. The
summary gets the ledger's totals per ``(kind, direction)`` and every node's peak storage as public fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedge.comm import Ledger

MIB = 8 * 2**20  # bits in one MB (2^20 bytes)


def evaluated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of evaluated rounds (those that carry an accuracy)."""
    return [row for row in rows if "accuracy" in row]


def round_costs(ledger: Ledger) -> dict[str, Any]:
    """Cumulative bits by direction (up, down, peer) and kind, and the bits each node holds now."""
    links: dict[str, dict[str, int]] = {}
    for (kind, way), bits in sorted(ledger.totals().items()):
        links.setdefault(way, {})[kind] = bits
    storage = {node: sum(held.values()) for node, held in ledger.storage.items()}
    return {"bits_by_link": links, "storage_by_node": storage}


def ledger_summary(ledger: Ledger) -> dict[str, Any]:
    """The ledger's totals per kind and direction, and every node's peak storage, for ``summary.json``."""
    kinds = [
        {"kind": kind, "direction": way, "bits": bits, "mb": bits / MIB}
        for (kind, way), bits in sorted(ledger.totals().items())
    ]
    return {"ledger_kinds": kinds, "peak_storage_bits": ledger.peak_storage()}
