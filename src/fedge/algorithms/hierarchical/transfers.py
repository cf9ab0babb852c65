"""The hierarchy's model transfers: cells' submodels between cloud, edge servers and clients.

A payload is the values a cell's submodel really holds (:meth:`CellViews.real`) and its floating buffers;
each goes through its link's codec and, when the codec is lossy, the receiver works on the decoded values
placed back into the submodel. Storage is each node's fp32 model or submodel.
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.algorithms.base import Context
from fedge.algorithms.hierarchical.cells import Cells
from fedge.algorithms.hierarchical.config import HierarchicalConfig
from fedge.algorithms.hierarchical.submodel import CellViews, Tensors
from fedge.comm import Link, nodes, state_bits
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.tensors import floating


def cell_payload(views: CellViews, cell: int, rows: slice, params: Tensors, buffers: Tensors) -> Tensors:
    """What the holders in ``rows`` (stacked) of cell ``cell``'s submodel send: the values the submodel
    really holds and the floating buffers (BatchNorm statistics); integer counters are not sent."""
    sent = {**{k: v[rows] for k, v in params.items()}, **{k: v[rows] for k, v in floating(buffers).items()}}
    return views.real(cell, sent)


def place_decoded(views: CellViews, cell: int, stacked: Tensors, decoded: Tensors) -> Tensors:
    """``stacked`` (cell ``cell``'s tensors over some holders) with its real values replaced by ``decoded``
    (what :func:`cell_payload` sent, as the receiver decodes it): the inverse of ``views.real``."""
    out = dict(stacked)
    for name, value in decoded.items():
        role = views.roles.get(name)
        if role is None:
            out[name] = value
            continue
        placed, valid = stacked[name].clone(), views.valid[role[0]][cell]
        if role[1] == "row":
            placed[:, valid] = value
        else:
            placed[:, :, valid] = value
        out[name] = placed
    return out


def received_rows(
    views: CellViews, cell: int, rows: slice, params: Tensors, buffers: Tensors, decoded: Tensors
) -> tuple[Tensors, Tensors]:
    """``params`` and ``buffers`` (stacked) with rows ``rows`` of cell ``cell`` replaced by what was
    decoded from their payload."""
    held = {**{k: v[rows] for k, v in params.items()}, **{k: v[rows] for k, v in buffers.items()}}
    placed = place_decoded(views, cell, held, decoded)
    new_params = {k: torch.cat([v[: rows.start], placed[k], v[rows.stop :]]) for k, v in params.items()}
    new_buffers = {k: torch.cat([v[: rows.start], placed[k], v[rows.stop :]]) for k, v in buffers.items()}
    return new_params, new_buffers


def per_value_bits(link: Link, values: int) -> float:
    """Bits a link spends per value on a dense payload of ``values`` values (32 for fp32)."""
    counts = np.array([[values]], dtype=np.int64)
    return float(link.codec.bits(counts, counts)[0]) / values


class CellTransfers:
    """The transfers of :class:`~fedge.algorithms.hierarchical.hierarchy.HierarchicalFL` (a mixin: it reads
    the host's cells, links, nodes and bit tallies)."""

    cfg: HierarchicalConfig
    ctx: Context
    cells: Cells
    nodes: list[str]
    up: Link
    down: Link
    edge_up: Link
    edge_down: Link
    params: Tensors
    buffers: Tensors
    client_up_bits: np.ndarray
    cell_up_bits: np.ndarray

    def _send_cells(
        self, t: int, kind: str, up: bool, views: CellViews, cell_params: Tensors, cell_buffers: Tensors
    ) -> tuple[Tensors, Tensors, np.ndarray]:
        """Each cell's submodel (real values only) between the cloud and its edge server: the cells'
        params and buffers as received, and each submodel's size at fp32 (what a node holds)."""
        link = self.edge_up if up else self.edge_down
        held = np.zeros(self.cells.num_cells, dtype=np.int64)
        for j in range(self.cells.num_cells):
            payload = cell_payload(views, j, slice(j, j + 1), cell_params, cell_buffers)
            ends = (nodes.edge(j), nodes.CLOUD) if up else (nodes.CLOUD, nodes.edge(j))
            sent = link.send(t, *ends, kind, payload, stacked=True)
            held[j] = state_bits(payload)
            if not link.codec.lossless:
                cell_params, cell_buffers = received_rows(
                    views, j, slice(j, j + 1), cell_params, cell_buffers, sent.payload
                )
        return cell_params, cell_buffers, held

    def _broadcast(
        self, t: int, views: CellViews, cell_params: Tensors, cell_buffers: Tensors
    ) -> tuple[Tensors, Tensors]:
        """Each edge server sends its cell's model to its clients (``model_down``); the cells' params and
        buffers as the clients decode them."""
        cells = self.cells
        start_params, start_buffers = cell_params, cell_buffers
        for j in range(cells.num_cells):
            payload = cell_payload(views, j, slice(j, j + 1), cell_params, cell_buffers)
            members = self.nodes[j * cells.per_cell : (j + 1) * cells.per_cell]
            sent = self.down.send(
                t, nodes.edge(j), members, "model_down", {k: v[0] for k, v in payload.items()}
            )
            if not self.down.codec.lossless:
                decoded = {k: v.unsqueeze(0) for k, v in sent.payload.items()}
                start_params, start_buffers = received_rows(
                    views, j, slice(j, j + 1), start_params, start_buffers, decoded
                )
        return start_params, start_buffers

    def _upload(self, t: int, views: CellViews, clients: Cohort, bank: ClientBank) -> tuple[Tensors, Tensors]:
        """Every client sends its trained model to its edge server (``model_up``, or AirComp's
        ``update_up_analog``); this process's rows as the edge servers decode them. Records each client's
        uplink bits and one client's upload per cell (the latency's)."""
        cells = self.cells
        kind = "model_up" if self.cfg.aggregation == "oma" else "update_up_analog"
        uploaded, uploaded_buffers = bank.params, bank.buffers
        for j in range(cells.num_cells):
            rows = slice(j * cells.per_cell, (j + 1) * cells.per_cell)
            cell = clients.part(rows)  # this process's clients of cell j
            local = slice(cell.start + rows.start - clients.start, cell.stop + rows.start - clients.start)
            payload = cell_payload(views, j, local, bank.params, bank.buffers)
            up = cell.send(self.up, t, self.nodes[rows], nodes.edge(j), kind, payload)
            self.client_up_bits[rows] += up.bits
            self.cell_up_bits[j] = up.bits.max(initial=0)
            if not self.up.codec.lossless and len(cell):
                uploaded, uploaded_buffers = received_rows(
                    views, j, local, uploaded, uploaded_buffers, up.payload
                )
        return uploaded, uploaded_buffers

    def _storage(self, cell_bits: np.ndarray) -> None:
        """What each node holds: the cloud the full model, each edge server and client its submodel."""
        network = self.ctx.network
        network.hold(nodes.CLOUD, "model", {**self.params, **self.buffers})
        for j, bits in enumerate(cell_bits):
            network.hold(nodes.edge(j), "submodel", int(bits))
            network.hold([self.nodes[c] for c in self.cells.members(j)], "model", int(bits))
