"""The cells round: a cloud, ``N`` edge servers and their cells' clients, and the work every
hierarchical round does (HIST, HFedAvg).

A hierarchical global round is its paper's lines -- cut a submodel per cell, ``E`` edge rounds of local
training and edge aggregation, the cloud's merge -- around the same pipes: each cell's submodel sent
between the cloud and its edge server and between the edge server and its clients (only the values the
submodel really holds, through the links' codecs, the receivers working on what they decode), this
process's rows of the clients trained and uploaded, the edge servers' and the cloud's aggregations
through their sites' pipelines, the clock closed by the cells' rule (:func:`fedge.system.cells_round`)
and every node's storage. :class:`CellsRuntime` opens a round; :class:`CellsRound` does those steps, so
that no algorithm writes a link send, a storage hold, cohort row arithmetic or a latency formula itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from fedge.aggregation import Reducer, Updates, sites
from fedge.comm import Link, nodes, state_bits
from fedge.config import OMNISCIENT_ATTACKS
from fedge.data.federated import BatchPlan, FederatedData
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.engine.step import StepFn
from fedge.errors import ConfigError
from fedge.runtime.adversary import Adversary, poisoned
from fedge.runtime.cell_adversary import CellTally, cell_shares
from fedge.runtime.context import Context
from fedge.runtime.edge_adversary import EdgeAdversary
from fedge.runtime.spread_adversary import cell_poisoned
from fedge.system import CellsWork, cells_round
from fedge.system.cells import RadioTiming
from fedge.tensors import Tensors, floating


@dataclass(frozen=True)
class Cells:
    """``num_cells`` cells of ``per_cell`` clients each; the active clients are ``0 .. size - 1``, cell
    ``j`` serving clients ``j per_cell .. (j + 1) per_cell - 1``."""

    num_cells: int
    per_cell: int

    @classmethod
    def even(cls, num_clients: int, num_cells: int) -> Cells:
        """Cells over ``num_clients`` clients; raises :class:`ConfigError` with more cells than clients."""
        if num_cells > num_clients:
            raise ConfigError(
                "algorithm.cells", f"{num_cells} cells but only {num_clients} clients (partition.num_clients)"
            )
        return cls(num_cells, num_clients // num_cells)

    @property
    def size(self) -> int:
        """Number of active clients."""
        return self.num_cells * self.per_cell

    @property
    def cell_of(self) -> np.ndarray:
        """The cell of every active client."""
        return np.repeat(np.arange(self.num_cells), self.per_cell)

    def members(self, cell: int) -> np.ndarray:
        """The clients of ``cell``."""
        return np.arange(cell * self.per_cell, (cell + 1) * self.per_cell)

    def rows(self, cell: int) -> slice:
        """The rows of ``cell``'s clients in a tensor stacked over the active clients."""
        return slice(cell * self.per_cell, (cell + 1) * self.per_cell)

    def groups(self, count: int) -> np.ndarray:
        """The band of every cell when cells are cut in order into ``count`` equal bands."""
        return np.arange(self.num_cells) * count // self.num_cells


class Submodels(Protocol):
    """Where each cell's submodel sits in its tensors (HIST's cell views; HFedAvg's whole model)."""

    def real(self, cell: int, stacked: Tensors) -> Tensors:
        """The values cell ``cell``'s submodel really holds, from tensors stacked over some holders."""
        ...

    def placed(self, cell: int, stacked: Tensors, decoded: Tensors) -> Tensors:
        """``stacked`` with the values :meth:`real` took replaced by ``decoded``."""
        ...


@dataclass(frozen=True)
class CellLinks:
    """The hierarchy's links: client to edge (``up``), edge to client (``down``), edge to cloud and cloud
    to edge; ``analogue``: the clients' uploads are AirComp's analogue symbols (``update_up_analog``)."""

    up: Link
    down: Link
    edge_up: Link
    edge_down: Link
    analogue: bool = False


def _payload(submodels: Submodels, cell: int, rows: slice, params: Tensors, buffers: Tensors) -> Tensors:
    """What the holders in ``rows`` (stacked) of cell ``cell``'s submodel send: the values it really
    holds and the floating buffers (BatchNorm statistics); integer counters are not sent."""
    sent = {**{k: v[rows] for k, v in params.items()}, **{k: v[rows] for k, v in floating(buffers).items()}}
    return submodels.real(cell, sent)


def _received(
    submodels: Submodels, cell: int, rows: slice, params: Tensors, buffers: Tensors, decoded: Tensors
) -> tuple[Tensors, Tensors]:
    """``params`` and ``buffers`` (stacked) with rows ``rows`` of cell ``cell`` replaced by what was
    decoded from their payload."""
    held = {**{k: v[rows] for k, v in params.items()}, **{k: v[rows] for k, v in buffers.items()}}
    placed = submodels.placed(cell, held, decoded)
    new_params = {k: torch.cat([v[: rows.start], placed[k], v[rows.stop :]]) for k, v in params.items()}
    new_buffers = {k: torch.cat([v[: rows.start], placed[k], v[rows.stop :]]) for k, v in buffers.items()}
    return new_params, new_buffers


@dataclass
class CellsRound:
    """Global round ``round`` of the ``cells`` with their ``submodels``; this process runs the rows of
    ``cohort`` of the active clients. ``client_bits`` is every active client's uplink bits of the round,
    ``cell_bits`` one client's upload per cell in the last edge round (what the OMA latency reads),
    ``submodel_bits`` each cell's submodel at fp32 (what its edge server and clients hold). An
    ``adversary``'s malicious members poison their uploads (:mod:`fedge.runtime.cell_adversary`), its
    malicious ``edges`` theirs to the cloud (:mod:`fedge.runtime.edge_adversary`)."""

    ctx: Context
    round: int
    cells: Cells
    links: CellLinks
    submodels: Submodels
    cohort: Cohort
    adversary: Adversary | None = None
    edges: EdgeAdversary | None = None
    tally: CellTally = field(default_factory=CellTally)
    edge_figures: dict[str, object] = field(default_factory=dict)
    client_bits: np.ndarray = field(init=False)
    cell_bits: np.ndarray = field(init=False)
    submodel_bits: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.client_bits = np.zeros(self.cells.size, dtype=np.int64)
        self.cell_bits = np.zeros(self.cells.num_cells, dtype=np.int64)
        self.submodel_bits = np.zeros(self.cells.num_cells, dtype=np.int64)

    @property
    def receivers(self) -> list[str]:
        """The active clients' node names."""
        return nodes.clients(range(self.cells.size))

    @property
    def local_clients(self) -> tuple[int, ...]:
        """The clients this process trains."""
        return tuple(range(self.cohort.start, self.cohort.stop))

    @property
    def local_cells(self) -> torch.Tensor:
        """The cell of every client this process trains."""
        return torch.as_tensor(self.cells.cell_of[self.cohort.rows], device=self.ctx.device)

    def send_cells(self, up: bool, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        """Each cell's submodel (real values only) between the cloud and its edge server
        (``submodel_up`` / ``submodel_down``): the cells' params and buffers as received; each
        submodel's size at fp32 (what a node holds) goes to :attr:`submodel_bits`."""
        link = self.links.edge_up if up else self.links.edge_down
        kind = "submodel_up" if up else "submodel_down"
        held = np.zeros(self.cells.num_cells, dtype=np.int64)
        for j in range(self.cells.num_cells):
            payload = _payload(self.submodels, j, slice(j, j + 1), params, buffers)
            ends = (nodes.edge(j), nodes.CLOUD) if up else (nodes.CLOUD, nodes.edge(j))
            sent = link.send(self.round, *ends, kind, payload, stacked=True)
            held[j] = state_bits(payload)
            if not link.codec.lossless:
                params, buffers = _received(self.submodels, j, slice(j, j + 1), params, buffers, sent.payload)
        self.submodel_bits = held
        return params, buffers

    def broadcast(self, params: Tensors, buffers: Tensors) -> tuple[Tensors, Tensors]:
        """Each edge server sends its cell's model to its clients (``model_down``); the cells' params and
        buffers as the clients decode them."""
        down, receivers = self.links.down, self.receivers
        start_params, start_buffers = params, buffers
        for j in range(self.cells.num_cells):
            payload = _payload(self.submodels, j, slice(j, j + 1), params, buffers)
            members = receivers[self.cells.rows(j)]
            sent = down.send(
                self.round, nodes.edge(j), members, "model_down", {k: v[0] for k, v in payload.items()}
            )
            if not down.codec.lossless:
                decoded = {k: v.unsqueeze(0) for k, v in sent.payload.items()}
                start_params, start_buffers = _received(
                    self.submodels, j, slice(j, j + 1), start_params, start_buffers, decoded
                )
        return start_params, start_buffers

    def bank(
        self, params: Tensors, buffers: Tensors, opt_state: Callable[[Tensors, torch.Tensor], Tensors]
    ) -> ClientBank:
        """This process's clients, each from its cell's model (``params``, ``buffers`` stacked over the
        cells), with the optimizer state ``opt_state(rows, cells)`` gives their rows of the parameters
        and their cells."""
        cell_of = self.local_cells
        rows = {k: v[cell_of] for k, v in params.items()}
        buffer_rows = {k: v[cell_of] for k, v in buffers.items()}
        return ClientBank(self.local_clients, rows, buffer_rows, opt_state(rows, cell_of))

    def training(self, data: FederatedData) -> FederatedData:
        """What the members train on: ``data``, or an attacking adversary's view of it (flipped labels
        under ``label_flip``; a backdoor's stamped copies, which its members' batches must index)."""
        return data if self.adversary is None else self.adversary.data(self.round, data)

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        """The executor trains ``bank`` by ``plan`` on ``data`` (:meth:`training`'s view); each row's mean
        training loss."""
        return self.ctx.executor.train(step, bank, plan, data, lr)

    def collect(self, bank: ClientBank) -> tuple[Tensors, Tensors]:
        """Every client sends its trained model to its edge server (``model_up``, or AirComp's
        ``update_up_analog``); this process's rows as the edge servers decode them. Adds each client's
        uplink bits to :attr:`client_bits` and records one client's upload per cell in :attr:`cell_bits`
        (on the ledger too, unless the edge's reducer records the upload itself:
        :meth:`~fedge.runtime.context.Context.records_upload`)."""
        cells, up = self.cells, self.links.up
        kind = "update_up_analog" if self.links.analogue else "model_up"
        record = self.ctx.records_upload(sites.EDGE)
        uploaded, uploaded_buffers = bank.params, bank.buffers
        receivers = self.receivers
        for j in range(cells.num_cells):
            rows = cells.rows(j)
            cell, local = self.cell_rows(j)
            payload = _payload(self.submodels, j, local, bank.params, bank.buffers)
            sent = cell.send(up, self.round, receivers[rows], nodes.edge(j), kind, payload, record=record)
            self.client_bits[rows] += sent.bits
            self.cell_bits[j] = sent.bits.max(initial=0)
            if not up.codec.lossless and len(cell):
                uploaded, uploaded_buffers = _received(
                    self.submodels, j, local, uploaded, uploaded_buffers, sent.payload
                )
        return uploaded, uploaded_buffers

    def poison(
        self, edge_round: int, params: Tensors, buffers: Tensors, start: tuple[Tensors, Tensors]
    ) -> tuple[Tensors, Tensors]:
        """The uploads of :meth:`collect` (this process's rows) with each cell's attacking members'
        replaced by the adversary's (:func:`~fedge.runtime.spread_adversary.cell_poisoned`), on the values
        their submodel holds; ``start``: the cells' models the edge servers broadcast (stacked
        ``[N, ...]``), each cell's reference."""
        if self.adversary is None:
            return params, buffers
        for j in range(self.cells.num_cells):
            members = self.cells.members(j)
            if not self.adversary.mask(self.round, members).any():
                continue
            cell, local = self.cell_rows(j)
            sent = _payload(self.submodels, j, local, params, buffers)
            reference = {k: v[0] for k, v in _payload(self.submodels, j, slice(j, j + 1), *start).items()}
            replaced = cell_poisoned(self.adversary, self.round, edge_round, members, sent, reference, cell)
            if len(cell):
                params, buffers = _received(self.submodels, j, local, params, buffers, replaced)
        return params, buffers

    def cell_rows(self, cell: int) -> tuple[Cohort, slice]:
        """This process's part of ``cell``'s clients, and where their rows sit among this process's."""
        rows, start = self.cells.rows(cell), self.cohort.start
        part = self.cohort.part(rows)
        return part, slice(part.start + rows.start - start, part.stop + rows.start - start)

    def poison_edges(
        self, params: Tensors, buffers: Tensors, sent: tuple[Tensors, Tensors]
    ) -> tuple[Tensors, Tensors]:
        """The cells' uploads to the cloud (stacked ``[N, ...]``, as the cloud decoded them) with the
        attacking edges' replaced, on the values their submodel holds; ``sent``: the cells' models the
        cloud sent them (stacked), each edge's reference."""
        edges, device = self.edges, self.ctx.device
        if edges is None:
            return params, buffers
        bad = edges.mask(self.round, self.cells.num_cells)
        attack = edges.config.attack
        if bad.any() and attack in OMNISCIENT_ATTACKS:  # HFedAvg: every edge holds the whole model
            rows = {**params, **floating(buffers)}
            reference = {k: v[0] for k, v in {**sent[0], **floating(sent[1])}.items()}
            replaced = poisoned(
                attack, edges.config.options, rows, reference, torch.as_tensor(bad, device=device)
            )
            return {k: replaced[k] for k in params}, {k: replaced.get(k, v) for k, v in buffers.items()}
        one = torch.ones(1, dtype=torch.bool, device=device)
        for j in np.flatnonzero(bad).tolist():
            row = slice(j, j + 1)
            upload = _payload(self.submodels, j, row, params, buffers)
            reference = {k: v[0] for k, v in _payload(self.submodels, j, row, *sent).items()}
            replaced = poisoned(
                attack, edges.options(bad), upload, reference, one, edges.noise(self.round, j, device)
            )
            params, buffers = _received(self.submodels, j, row, params, buffers, replaced)
        return params, buffers

    def figures(self) -> dict[str, object]:
        """The adversary's figures of the round (:meth:`~fedge.runtime.cell_adversary.CellTally.figures`
        and :meth:`~fedge.runtime.edge_adversary.EdgeAdversary.figures`; none without an adversary)."""
        members = {} if self.adversary is None else self.tally.figures()
        return {**members, **self.edge_figures}

    @property
    def edge_reducer(self) -> Reducer:
        """The edge pipeline's reducer (what AirComp's air sum wraps)."""
        return self.ctx.pipeline(sites.EDGE).reducer

    def aggregate(
        self, params: Tensors, buffers: Tensors, reference: Tensors, reducer: Reducer | None = None
    ) -> tuple[Tensors, Tensors]:
        """Each edge server's new model from its clients' uploads (this process's rows), through the
        edge's pipeline: by default its clients' mean (:class:`~fedge.aggregation.BlockMean`); the rows
        carry their senders (what a client-level noise stage keys and records by). ``reference`` holds
        the cells' models the clients started from; ``reducer`` replaces the pipeline's own (AirComp's
        over-the-air sum)."""
        cells, cohort, device = self.cells, self.cohort, self.ctx.device
        weights = torch.zeros(cells.num_cells, len(cohort), dtype=torch.float64, device=device)
        weights[self.local_cells, torch.arange(len(cohort), device=device)] = 1.0 / cells.per_cell
        pipeline = self.ctx.pipeline(sites.EDGE)
        if reducer is not None:
            pipeline = replace(pipeline, reducer=reducer)
        updates = Updates.of(sites.EDGE, self.round, params | buffers, weights, reference, self.local_clients)
        means = pipeline.reduce(updates, cohort)
        if self.adversary is not None:  # every client's weight: the reducer's reports name every row
            every = np.arange(cells.size)
            bad = self.adversary.mask(self.round, every)
            edge_weights = torch.zeros(cells.num_cells, cells.size, dtype=torch.float64)
            edge_weights[cells.cell_of, every] = 1.0 / cells.per_cell
            self.tally.add(int(bad.sum()), cell_shares(edge_weights, bad, pipeline))
        return {k: means[k] for k in params}, {k: means[k] for k in buffers}

    def cloud(self, shared: Tensors, model: Tensors, owned: np.ndarray) -> Tensors:
        """The cloud's aggregation of the cells' shared tensors (stacked ``[N, ...]``) through its
        pipeline: by default their unweighted mean (HIST Eq. 7); ``model``, the previous global model,
        is the reference; ``owned``: the values each cell alone holds besides (HIST's neurons), what
        the malicious edges' kept share counts whole."""
        cells = self.cells.num_cells
        weights = torch.full((cells,), 1.0 / cells, dtype=torch.float64, device=self.ctx.device)
        reference = {k: v for k, v in model.items() if k in shared}
        updates = Updates.of(sites.CLOUD, self.round, shared, weights, reference)
        pipeline = self.ctx.pipeline(sites.CLOUD)
        merged = pipeline.reduce(updates)
        if self.edges is not None:
            values = sum(v[0].numel() for v in floating(shared).values())
            self.edge_figures = self.edges.figures(self.round, weights, pipeline, values, owned)
        return merged

    def mean(self, losses: torch.Tensor) -> torch.Tensor:
        """The mean over every active client of a per-client value (this process's rows in ``losses``)."""
        return self.cohort.mean(losses)

    def close(
        self,
        values: np.ndarray,
        model_values: int,
        cpu_hz: np.ndarray,
        edge_rounds: int,
        steps: int,
        bandwidth_hz: np.ndarray,
        radio: RadioTiming,
        rates: np.ndarray | None,
        *,
        model: Tensors,
    ) -> float:
        """Advance the clock by the cells' rule (HIST Eqs. 17-18 with OMA ``rates``, Eq. 35 for AirComp,
        :func:`~fedge.system.cells_round`) and return the round's seconds: each cell's ``values`` of the
        ``model_values``, its clients' ``cpu_hz``, ``edge_rounds`` of ``steps`` local steps, the uploads of
        :attr:`cell_bits` and each cell's AirComp band. Then record what each node holds at the round's
        end: the cloud the new ``model``, each edge server and client its cell's submodel."""
        members = [self.cells.members(j) for j in range(self.cells.num_cells)]
        work = CellsWork(
            members, values, model_values, cpu_hz, self.cell_bits, edge_rounds, steps, bandwidth_hz
        )
        system = self.ctx.system
        seconds = system.charge(cells_round(system, work, radio, rates)).seconds
        self._hold(model)
        return seconds

    def _hold(self, model: Tensors) -> None:
        """What each node holds: the cloud the full ``model``, each edge server and client its cell's
        submodel (:attr:`submodel_bits` at fp32)."""
        network, receivers = self.ctx.network, self.receivers
        network.hold(nodes.CLOUD, "model", model)
        for j, bits in enumerate(self.submodel_bits):
            network.hold(nodes.edge(j), "submodel", int(bits))
            network.hold(receivers[self.cells.rows(j)], "model", int(bits))


class CellsRuntime:
    """Opens the global rounds of the ``cells`` over ``links`` (every active client works every round),
    the ``adversary``'s members among them, the malicious ``edges`` among their edge servers."""

    def __init__(
        self,
        ctx: Context,
        cells: Cells,
        links: CellLinks,
        adversary: Adversary | None = None,
        edges: EdgeAdversary | None = None,
    ):
        self.ctx, self.cells, self.links, self.adversary, self.edges = ctx, cells, links, adversary, edges

    def open(self, t: int, submodels: Submodels) -> CellsRound:
        """Round ``t`` of the cells with their ``submodels`` of the round."""
        cohort = self.ctx.cohorts.of(self.cells.size)
        return CellsRound(self.ctx, t, self.cells, self.links, submodels, cohort, self.adversary, self.edges)
