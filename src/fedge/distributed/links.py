"""A stacked send of one process's rows whose ledger entries are the whole cohort's, in cohort order.

Each process encodes and counts only the rows it trained, through a copy of the link bound to a scratch
ledger; the processes then exchange their entries (node names and integer bits) and every process
records all of them in rank order, which is row order (rows are contiguous per process). So the ledger
on every process is the one a single process writes, bit for bit, and the bits per row of the whole
cohort are known everywhere (the simulated clock needs them).

A stochastic codec (the quantizer, random sparsification) draws row ``r``'s noise from the seed the
link gives cohort row ``r`` of this send, on every process: the link's own seed and send counter, with
cohort-wide row numbers. So the noise is the one a single process draws, and a second send of one kind
in a round draws new noise, as in one process.
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.comm import Ledger
from fedge.comm.link import Link, Nodes, Sent
from fedge.distributed.group import Group
from fedge.distributed.shards import Shard
from fedge.tensors import Tensors


def _local(nodes: Nodes, shard: Shard) -> Nodes:
    return nodes if isinstance(nodes, str) else list(nodes)[shard.start : shard.stop]


def send_rows(
    group: Group,
    link: Link,
    round_: int,
    src: Nodes,
    dst: Nodes,
    kind: str,
    payload: Tensors,
    shard: Shard,
    *,
    lengths: np.ndarray | torch.Tensor | None = None,
    entry_mask: torch.Tensor | None = None,
    record: bool = True,
) -> Sent:
    """``link.send(..., stacked=True)`` of rows ``shard`` of a cohort; ``src``/``dst`` name the whole
    cohort's senders and receivers (on the ledger unless ``record`` is false). Returns the shard's
    received rows and the bits of *every* cohort row.
    """
    if not group.distributed:
        return link.send(
            round_,
            src,
            dst,
            kind,
            payload,
            stacked=True,
            lengths=lengths,
            entry_mask=entry_mask,
            record=record,
        )
    # every process advances the link's send counter, with or without rows in this send
    seeds = link.row_seeds(round_, kind, shard.total)[shard.rows] if link.codec.stochastic else None
    mine: tuple[list[str], list[str], np.ndarray, np.ndarray] = (
        [],
        [],
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
    )
    received = payload  # a process without rows in this send sends nothing
    if len(shard):
        scratch = Ledger()
        sent = Link(scratch, link.codec, link.seed).send(
            round_, _local(src, shard), _local(dst, shard), kind, payload, stacked=True, lengths=lengths,
            entry_mask=entry_mask, seeds=seeds,
        )  # fmt: skip
        state = scratch.state_dict()
        names, columns = state["nodes"], state["columns"]
        mine = (
            [names[i] for i in columns["src"]],
            [names[i] for i in columns["dst"]],
            np.asarray(columns["bits"], dtype=np.int64),
            np.asarray(sent.bits, dtype=np.int64),
        )
        received = sent.payload
    parts = group.all_objects(mine)
    senders = [name for part in parts for name in part[0]]
    receivers = [name for part in parts for name in part[1]]
    if senders and record:
        link.ledger.record(round_, senders, receivers, kind, np.concatenate([part[2] for part in parts]))
    return Sent(received, np.concatenate([part[3] for part in parts]))
