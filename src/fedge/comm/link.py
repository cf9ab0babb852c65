"""Links: every transfer of an algorithm encoded, counted and recorded in one call.

A :class:`Link` is a codec bound to the run's ledger. ``send`` encodes a payload the way the codec
puts it on the air, counts the bits each sender spent (only the values it really sends: the real rows
of a padded batch, the entries dropout kept), writes one ledger entry per transfer and returns what
the receivers decode; ``account`` records what such a send would from the payload's shapes alone, for
transfers whose values no receiver uses. Storage a node holds in the same encoding is metered by
``store``. The :class:`Network` hands out links and meters plain fp32 state; algorithms talk to nothing
else.

A stochastic codec (the quantizer, random sparsification) draws each payload row's randomness from a
seed the link derives from the run seed, the transfer kind, the round, the how-many-th send of that kind
in the round it is, and the row: the same sends in the same order draw the same values on any executor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from fedge.comm.codecs import Codec, nonzero_counts, value_counts
from fedge.comm.ledger import Ledger, RoundTraffic
from fedge.comm.registry import get_codec
from fedge.rng import derive_seed
from fedge.tensors import Tensors, floating

Nodes = str | Sequence[str]
FP32_BITS = 32


class Sent(NamedTuple):
    """What a send delivered: the payload as the receivers decode it, and the bits of each payload row
    (one entry for an unstacked payload; 0 for a stacked row that sent nothing)."""

    payload: Tensors
    bits: np.ndarray


def state_bits(tensors: Tensors) -> int:
    """Bits of a state's floating tensors at 32 bits per value: what a node holds of a model copy."""
    return FP32_BITS * sum(t.numel() for t in floating(tensors).values())


def _names(nodes: Nodes, count: int) -> list[str]:
    """``count`` node names: a single name repeated, or a list of exactly ``count``."""
    names = [nodes] * count if isinstance(nodes, str) else list(nodes)
    if len(names) != count:
        raise ValueError(f"expected {count} node names, got {len(names)}")
    return names


def _sent_counts(
    payload: Tensors, lengths: np.ndarray | None, entry_mask: torch.Tensor | None, nonzeros: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Values (and non-zero values) each row of a stacked payload really sends, per tensor."""
    if entry_mask is None and lengths is None:
        return value_counts(payload, True), nonzero_counts(payload, True) if nonzeros else None
    values, nonzero = [], []
    for t in payload.values():
        if entry_mask is None and not nonzeros and lengths is not None:
            values.append(lengths * t[0, 0].numel())
            continue
        if entry_mask is not None:
            mask = entry_mask.reshape(t.shape[0], -1) > 0
        else:
            width = torch.arange(t.shape[1], device=t.device)
            real = width[None, :] < torch.as_tensor(lengths, device=t.device)[:, None]
            mask = real.reshape(*real.shape, *([1] * (t.dim() - 2))).expand(t.shape).reshape(t.shape[0], -1)
        values.append(mask.sum(dim=1).cpu().numpy())
        if nonzeros:
            nonzero.append(((t.reshape(t.shape[0], -1) != 0) & mask).sum(dim=1).cpu().numpy())
    stacked = np.stack(values, axis=1).astype(np.int64)
    return stacked, np.stack(nonzero, axis=1).astype(np.int64) if nonzeros else None


class Link:
    """A codec bound to the ledger: one family of transfers (e.g. everything clients send the server)."""

    def __init__(self, ledger: Ledger, codec: Codec, seed: int = 0):
        self.ledger = ledger
        self.codec = codec
        self.seed = seed
        self._sends: dict[tuple[int, str], int] = {}  # sends of each (round, kind) so far

    def row_seeds(self, round_: int, kind: str, rows: int) -> list[int]:
        """One seed per payload row for a stochastic codec's draws in the next send of ``kind`` in
        ``round_`` (each call counts as that send: a second send of one kind draws other noise)."""
        if self._sends and next(iter(self._sends))[0] != round_:
            self._sends.clear()
        occurrence = self._sends.get((round_, kind), 0)
        self._sends[(round_, kind)] = occurrence + 1
        return [derive_seed(self.seed, "link", kind, round_, occurrence, r) for r in range(rows)]

    def send(
        self,
        round_: int,
        src: Nodes,
        dst: Nodes,
        kind: str,
        payload: Tensors,
        *,
        stacked: bool = False,
        lengths: np.ndarray | torch.Tensor | None = None,
        entry_mask: torch.Tensor | None = None,
        row_of: Sequence[int] | np.ndarray | None = None,
        seeds: list[int] | None = None,
        record: bool = True,
    ) -> Sent:
        """Encode ``payload``, record its transfers as ``kind`` and return what the receivers decode.

        - Unstacked: one payload; each ``(src, dst)`` pair (a name, or equally long lists; a list on one
          side broadcasts the other) is a transfer of all of it.
        - ``stacked``: row ``r`` of every tensor is sender ``r``'s payload; transfer ``i`` carries row
          ``row_of[i]`` (default: transfer ``r`` carries row ``r``), from ``src[i]`` to ``dst[i]``.
        - ``lengths[r]``: only the first ``lengths[r]`` entries along dimension 1 of row ``r`` are real (a
          padded batch); they alone are counted, and a row of length 0 sends nothing.
        - ``entry_mask``: a 0/1 mask shaped like the payload's tensors; only kept entries are counted (values
          dropped by a mask both ends derive from a shared seed are never sent).
        - ``record`` false: the bits are counted and returned but not put on the ledger, for rows whose
          transfer a stage records in its own form (secure aggregation's masked vectors).
        """
        if seeds is None and self.codec.stochastic:
            rows = next(iter(payload.values())).shape[0] if stacked and payload else 1
            seeds = self.row_seeds(round_, kind, rows)
        received = self.codec.encode(payload, stacked, seeds)
        ledger = self.ledger if record else None
        if not stacked:
            return Sent(received, self._record_whole(ledger, round_, src, dst, kind, payload))
        bits = self._record_rows(ledger, round_, src, dst, kind, payload, lengths, entry_mask, row_of)
        return Sent(received, bits)

    def account(
        self,
        round_: int,
        src: Nodes,
        dst: Nodes,
        kind: str,
        shapes: Mapping[str, Sequence[int]],
        nonzeros: Mapping[str, int] | None = None,
    ) -> np.ndarray:
        """Record, as :meth:`send` of one unstacked payload would, a transfer whose values no receiver
        uses: a payload of tensors shaped ``shapes`` (in payload order) to every ``(src, dst)`` pair. The
        ledger rows, their bits and a stochastic codec's count of sends of ``kind`` are exactly those of
        that send; nothing is encoded. A codec that counts non-zero values reads ``nonzeros[name]`` for
        the tensors it names and takes every value of the others as non-zero. Returns the bits."""
        if self.codec.stochastic:
            self.row_seeds(round_, kind, 1)  # the send this stands for draws its noise here
        values = np.asarray([[math.prod(shape) for shape in shapes.values()]], dtype=np.int64)
        counted = None
        if self.codec.counts_nonzeros:
            given = nonzeros or {}
            counted = np.asarray(
                [[given.get(name, math.prod(shape)) for name, shape in shapes.items()]], dtype=np.int64
            )
        return self._record_bits(self.ledger, round_, src, dst, kind, self.codec.bits(values, counted))

    def _record_whole(
        self, ledger: Ledger | None, round_: int, src: Nodes, dst: Nodes, kind: str, payload: Tensors
    ) -> np.ndarray:
        """Record on ``ledger`` (none: nowhere) one unstacked payload sent to every ``(src, dst)`` pair;
        its bits."""
        nonzeros = nonzero_counts(payload, False) if self.codec.counts_nonzeros else None
        bits = self.codec.bits(value_counts(payload, False), nonzeros)
        return self._record_bits(ledger, round_, src, dst, kind, bits)

    def _record_bits(
        self, ledger: Ledger | None, round_: int, src: Nodes, dst: Nodes, kind: str, bits: np.ndarray
    ) -> np.ndarray:
        """Record ``bits`` (one payload's) for every ``(src, dst)`` pair on ``ledger``; returns them."""
        lists = [len(nodes) for nodes in (src, dst) if not isinstance(nodes, str)]
        count = lists[0] if lists else 1
        if count and ledger is not None:
            ledger.record(round_, _names(src, count), _names(dst, count), kind, np.repeat(bits, count))
        return bits

    def _record_rows(
        self,
        ledger: Ledger | None,
        round_: int,
        src: Nodes,
        dst: Nodes,
        kind: str,
        payload: Tensors,
        lengths: np.ndarray | torch.Tensor | None,
        entry_mask: torch.Tensor | None,
        row_of: Sequence[int] | np.ndarray | None,
    ) -> np.ndarray:
        """Record the transfers of a stacked payload (see :meth:`send`) on ``ledger`` (none: nowhere); the
        bits of each row."""
        real = None if lengths is None else np.asarray(torch.as_tensor(lengths).cpu())
        values, nonzeros = _sent_counts(payload, real, entry_mask, self.codec.counts_nonzeros)
        bits = self.codec.bits(values, nonzeros)
        if real is not None:
            bits = np.where(real > 0, bits, 0)
        carried = np.arange(len(bits)) if row_of is None else np.asarray(row_of, dtype=np.int64)
        sending = np.flatnonzero(real[carried] > 0) if real is not None else np.arange(len(carried))
        if len(sending) and ledger is not None:
            src_names, dst_names = _names(src, len(carried)), _names(dst, len(carried))
            senders, receivers = [src_names[i] for i in sending], [dst_names[i] for i in sending]
            ledger.record(round_, senders, receivers, kind, bits[carried[sending]])
        return bits

    def decode(self, round_: int, kind: str, payload: Tensors) -> Tensors:
        """What receivers decode from each row of a stacked payload, without recording a transfer: for
        algorithms that count a kind's transfers from one message (every row costs the same) but must
        hand each receiver its sender's own decoded row."""
        rows = next(iter(payload.values())).shape[0] if payload else 0
        seeds = self.row_seeds(round_, kind, rows) if self.codec.stochastic else None
        return self.codec.encode(payload, True, seeds)

    def store(self, nodes: Nodes, kind: str, payload: Tensors, *, stacked: bool = False) -> np.ndarray:
        """Meter what ``nodes`` hold of ``kind`` in this link's encoding (row ``r`` held by ``nodes[r]``
        when ``stacked``, else the same payload by every node); returns the bits per node."""
        nonzeros = nonzero_counts(payload, stacked) if self.codec.counts_nonzeros else None
        bits = self.codec.bits(value_counts(payload, stacked), nonzeros)
        names = [nodes] if isinstance(nodes, str) else list(nodes)
        held = bits if stacked else np.repeat(bits, len(names))
        for node, amount in zip(names, held, strict=True):
            self.ledger.set_storage(node, kind, int(amount))
        return held


class Network:
    """The links and storage meter of a run, over its ledger."""

    def __init__(self, ledger: Ledger, seed: int = 0):
        self.ledger = ledger
        self.seed = seed

    def link(self, codec: str | Codec) -> Link:
        """A link encoding with ``codec`` (a codec, or a name: ``fp32``, ``fp16``, ``sparse``, ``q8``...)."""
        return Link(self.ledger, get_codec(codec) if isinstance(codec, str) else codec, self.seed)

    def traffic(self, round_: int) -> RoundTraffic:
        """What the links carried in round ``round_`` (bits per node and direction), for the clock."""
        return self.ledger.round_traffic(round_)

    def hold(self, nodes: Nodes, kind: str, state: Tensors | int) -> None:
        """Meter what ``nodes`` hold of ``kind``: a state (its floating tensors at fp32) or a bit count."""
        bits = state if isinstance(state, int) else state_bits(state)
        for node in [nodes] if isinstance(nodes, str) else nodes:
            self.ledger.set_storage(node, kind, int(bits))
