"""One global round of cloud-edge-client training, shared by HIST and HFedAvg (HIST Algorithm 1).

The cloud cuts a submodel per cell (HFedAvg: the whole model), every cell runs ``E`` edge rounds -- its
clients train ``H`` local SGD steps from the edge model, the edge server averages them (OMA) or receives
their noisy over-the-air mean (AirComp) -- and the cloud merges the cells' submodels. All clients of all
cells train together in one executor call per edge round.

Ledger per global round: ``submodel_down`` (cloud to each edge), per edge round ``model_down`` (edge to
each client) and ``model_up`` (OMA) or ``update_up_analog`` (AirComp: analog symbols, counted as fp32
values so that the per-client uplink is comparable), and ``submodel_up`` (edge to cloud), each through
its link's codec (``codec_edge_down``, ``codec_down``, ``codec_up``, ``codec_edge_up``): receivers work
on the decoded values, OMA's upload time is the encoded upload's, and storage is the fp32 submodel. Simulated
latency per global round follows Eqs. 17-18 (OMA) or Eqs. 34-35 (AirComp); energy, which the paper
does not model, counts the same client-side compute and uplinks (:mod:`fedge.system.cells`).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np
import torch

from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.hierarchical.cells import Cells, cell_iid, fully_noniid
from fedge.algorithms.hierarchical.config import HierarchicalConfig
from fedge.algorithms.hierarchical.cost import BITS_PER_MB
from fedge.algorithms.hierarchical.masks import check_cells, partition_layout
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.algorithms.hierarchical.submodel import CellViews, Tensors
from fedge.algorithms.hierarchical.training import local_steps_plan, masked_step
from fedge.comm import Link, nodes, state_bits
from fedge.data.federated import FederatedData
from fedge.distributed import Cohort
from fedge.distributed.evaluate import evaluate_model_on
from fedge.engine import (
    ClientBank,
    buffers_of,
    classification_loss,
    make_optimizer,
    make_step,
    parameters_of,
)
from fedge.metrics import Evaluation, RoundReport
from fedge.rng import numpy_rng, torch_rng
from fedge.system import CellsWork, cells_round
from fedge.tensors import floating


def _payload(views: CellViews, cell: int, rows: slice, params: Tensors, buffers: Tensors) -> Tensors:
    """What the holders in ``rows`` (stacked) of cell ``cell``'s submodel send: the values the submodel
    really holds and the floating buffers (BatchNorm statistics); integer counters are not sent."""
    sent = {**{k: v[rows] for k, v in params.items()}, **{k: v[rows] for k, v in floating(buffers).items()}}
    return views.real(cell, sent)


def _place(views: CellViews, cell: int, stacked: Tensors, decoded: Tensors) -> Tensors:
    """``stacked`` (cell ``cell``'s tensors over some holders) with its real values replaced by ``decoded``
    (what :func:`_payload` sent, as the receiver decodes it): the inverse of ``views.real``."""
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


def _received(
    views: CellViews, cell: int, rows: slice, params: Tensors, buffers: Tensors, decoded: Tensors
) -> tuple[Tensors, Tensors]:
    """``params`` and ``buffers`` (stacked) with rows ``rows`` of cell ``cell`` replaced by what was
    decoded from their payload."""
    held = {**{k: v[rows] for k, v in params.items()}, **{k: v[rows] for k, v in buffers.items()}}
    placed = _place(views, cell, held, decoded)
    new_params = {k: torch.cat([v[: rows.start], placed[k], v[rows.stop :]]) for k, v in params.items()}
    new_buffers = {k: torch.cat([v[: rows.start], placed[k], v[rows.stop :]]) for k, v in buffers.items()}
    return new_params, new_buffers


def per_value_bits(link: Link, values: int) -> float:
    """Bits a link spends per value on a dense payload of ``values`` values (32 for fp32)."""
    counts = np.array([[values]], dtype=np.int64)
    return float(link.codec.bits(counts, counts)[0]) / values


def split_data(ctx: Context, cfg: HierarchicalConfig, cells: Cells) -> FederatedData:
    """The run's data with the training samples of the active clients split as ``cfg.split`` says."""
    labels = ctx.data.y_train.cpu().numpy()
    rng = numpy_rng(ctx.seed, "hist-split")
    if cfg.split == "fully_noniid":
        parts = fully_noniid(labels, cells.size, cfg.shards_per_client, rng)
    elif cfg.split == "cell_iid":
        parts = cell_iid(labels, cells, cfg.shards_per_client, rng)
    else:
        parts = ctx.data.client_train[: cells.size]
    view = copy.copy(ctx.data)  # shares the dataset tensors
    view.client_train = [np.asarray(p, dtype=np.int64) for p in parts]
    view.client_test = ctx.data.client_test[: cells.size]
    return view


class HierarchicalFL(Algorithm):
    """Cloud, ``N`` edge servers and their clients; subclasses say whether the FC layers are partitioned."""

    partitioned: ClassVar[bool] = False
    state_fields = ("params", "buffers", "client_up_bits")

    def __init__(self, ctx: Context, cfg: HierarchicalConfig):
        super().__init__(ctx, cfg)
        self.model = ctx.build_model().to(ctx.device)
        self.params = parameters_of(self.model)
        self.buffers = buffers_of(self.model)
        self.layout = partition_layout(self.model) if self.partitioned else ()
        self.cells = Cells.even(ctx.data.num_clients, cfg.cells)
        check_cells(self.layout, cfg.cells)
        self.data = split_data(ctx, cfg, self.cells)
        self.radio = CellRadio(cfg.radio, self.cells, ctx.seed)
        opt = cfg.optimizer
        self.sgd = make_optimizer(opt)
        self.plain_step = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        self.step = masked_step(self.plain_step, self.layout)
        network = ctx.network
        self.up, self.down = network.link(cfg.codec_up), network.link(cfg.codec_down)
        self.edge_up, self.edge_down = network.link(cfg.codec_edge_up), network.link(cfg.codec_edge_down)
        self.model_values = sum(p.numel() for p in self.params.values())
        self.cell_of = torch.as_tensor(self.cells.cell_of, device=ctx.device)
        self.nodes = nodes.clients(range(self.cells.size))
        self.client_up_bits = np.zeros(self.cells.size, dtype=np.int64)
        self.cell_up_bits = np.zeros(self.cells.num_cells, dtype=np.int64)  # one client's upload per cell

    def mask_sizes(self, round_: int, cpu_hz: np.ndarray, rates_bps: np.ndarray | None) -> np.ndarray:
        """Neurons per cell of the first partitioned layer in ``round_`` (nothing to size here)."""
        return np.zeros(0, dtype=np.int64)

    def views(self, round_: int, sizes: np.ndarray) -> CellViews:
        """The cells' submodels in ``round_``: here the whole model for every cell."""
        return CellViews.build((), [], self.cells.num_cells, "compact", self.ctx.device)

    def _send_cells(
        self, t: int, kind: str, up: bool, views: CellViews, cell_params: Tensors, cell_buffers: Tensors
    ) -> tuple[Tensors, Tensors, np.ndarray]:
        """Each cell's submodel (real values only) between the cloud and its edge server: the cells'
        params and buffers as received, and each submodel's size at fp32 (what a node holds)."""
        link = self.edge_up if up else self.edge_down
        held = np.zeros(self.cells.num_cells, dtype=np.int64)
        for j in range(self.cells.num_cells):
            payload = _payload(views, j, slice(j, j + 1), cell_params, cell_buffers)
            ends = (nodes.edge(j), nodes.CLOUD) if up else (nodes.CLOUD, nodes.edge(j))
            sent = link.send(t, *ends, kind, payload, stacked=True)
            held[j] = state_bits(payload)
            if not link.codec.lossless:
                cell_params, cell_buffers = _received(
                    views, j, slice(j, j + 1), cell_params, cell_buffers, sent.payload
                )
        return cell_params, cell_buffers, held

    def run_round(self, t: int) -> RoundReport:
        cfg = self.cfg
        cpu = self.radio.cpu_hz(t)
        rates = self.radio.oma_rates(t) if cfg.aggregation == "oma" else None
        sizes = self.mask_sizes(t, cpu, rates)
        views = self.views(t, sizes)
        cell_params, cell_buffers = views.gather(self.params), views.gather(self.buffers)
        cell_params, cell_buffers, cell_bits = self._send_cells(
            t, "submodel_down", False, views, cell_params, cell_buffers
        )
        losses, mses = [], []
        for e in range(cfg.edge_rounds):
            cell_params, cell_buffers, loss, mse = self._edge_round(t, e, views, cell_params, cell_buffers)
            losses.append(loss)
            mses.extend(mse)
        cell_params, cell_buffers, _ = self._send_cells(
            t, "submodel_up", True, views, cell_params, cell_buffers
        )
        self.params, self.buffers = views.merge(cell_params), views.merge(cell_buffers)
        values = views.values(self.params)
        latency = self._latency(values, cpu, rates, self.cell_up_bits)
        self._storage(cell_bits)
        up_mb = self.client_up_bits / BITS_PER_MB
        metrics: dict[str, Any] = {
            "latency_s": latency,
            "client_up_mb": float(up_mb.mean()),
            "client_up_mb_max": float(up_mb.max()),
        }
        if self.layout:
            metrics["mask_sizes"] = [int(s) for s in sizes]
        if mses:
            metrics["aircomp_mse"] = float(np.mean(mses))
        return RoundReport(float(torch.stack(losses).double().mean()), metrics)

    def _edge_round(
        self,
        t: int,
        e: int,
        views: CellViews,
        cell_params: Tensors,
        cell_buffers: Tensors,
    ) -> tuple[Tensors, Tensors, torch.Tensor, list[float]]:
        """Edge round ``e`` of global round ``t`` in every cell: broadcast, local steps, upload, mean.

        The clients of all cells are a cohort (this process trains and uploads its rows of it)."""
        clients = self.ctx.cohorts.of(self.cells.size)
        start_params, start_buffers = self._broadcast(t, views, cell_params, cell_buffers)
        bank, loss = self._train(t, e, views, clients, start_params, start_buffers)
        uploaded, uploaded_buffers = self._upload(t, views, clients, bank)
        new_params, new_buffers, mses = self._mean(t, e, views, clients, uploaded, uploaded_buffers)
        return new_params, new_buffers, clients.mean(loss), mses

    def _broadcast(
        self, t: int, views: CellViews, cell_params: Tensors, cell_buffers: Tensors
    ) -> tuple[Tensors, Tensors]:
        """Each edge server sends its cell's model to its clients (``model_down``); the cells' params and
        buffers as the clients decode them."""
        cells = self.cells
        start_params, start_buffers = cell_params, cell_buffers
        for j in range(cells.num_cells):
            payload = _payload(views, j, slice(j, j + 1), cell_params, cell_buffers)
            members = self.nodes[j * cells.per_cell : (j + 1) * cells.per_cell]
            sent = self.down.send(
                t, nodes.edge(j), members, "model_down", {k: v[0] for k, v in payload.items()}
            )
            if not self.down.codec.lossless:
                decoded = {k: v.unsqueeze(0) for k, v in sent.payload.items()}
                start_params, start_buffers = _received(
                    views, j, slice(j, j + 1), start_params, start_buffers, decoded
                )
        return start_params, start_buffers

    def _train(
        self, t: int, e: int, views: CellViews, clients: Cohort, cell_params: Tensors, cell_buffers: Tensors
    ) -> tuple[ClientBank, torch.Tensor]:
        """``H`` local steps of this process's clients from their cells' models: the trained bank and the
        clients' losses."""
        cfg = self.cfg
        cell_of = self.cell_of[clients.rows]
        params = {k: v[cell_of] for k, v in cell_params.items()}
        buffers = {k: v[cell_of] for k, v in cell_buffers.items()}
        opt_state = {**self.sgd.init(params, rows=len(cell_of)), **views.client_valid(cell_of)}
        bank = ClientBank(tuple(range(clients.start, clients.stop)), params, buffers, opt_state)
        plan = local_steps_plan(
            self.data, bank.clients, t, e, cfg.local_steps, cfg.batch_size, cohort=range(self.cells.size)
        )
        self.model.train()
        # every slot real (equal cells, compact form): masking multiplies by one, so the plain step gives
        # the same numbers without the multiplications
        padded = any(not bool(v.all()) for v in views.valid)
        step = self.step if padded else self.plain_step
        return bank, self.ctx.executor.train(step, bank, plan, self.data, cfg.optimizer.lr)

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
            payload = _payload(views, j, local, bank.params, bank.buffers)
            up = cell.send(self.up, t, self.nodes[rows], nodes.edge(j), kind, payload)
            self.client_up_bits[rows] += up.bits
            self.cell_up_bits[j] = up.bits.max(initial=0)
            if not self.up.codec.lossless and len(cell):
                uploaded, uploaded_buffers = _received(
                    views, j, local, uploaded, uploaded_buffers, up.payload
                )
        return uploaded, uploaded_buffers

    def _mean(
        self, t: int, e: int, views: CellViews, clients: Cohort, uploaded: Tensors, uploaded_buffers: Tensors
    ) -> tuple[Tensors, Tensors, list[float]]:
        """Each edge server's new model: its clients' mean (OMA), or its over-the-air estimate (AirComp,
        with each cell's per-element MSE)."""
        means = clients.block_mean(uploaded | uploaded_buffers, self.cells.num_cells)
        new_params, new_buffers = {k: means[k] for k in uploaded}, {k: means[k] for k in uploaded_buffers}
        mses = self._over_the_air(t, e, views, new_params) if self.cfg.aggregation == "aircomp" else []
        return new_params, new_buffers, mses

    def _over_the_air(self, t: int, e: int, views: CellViews, cell_params: Tensors) -> list[float]:
        """Turn each cell's exact client mean into its AirComp estimate (Eq. 26-27), in place.

        The edge model is ``x_j - gamma (mean_i delta_i + Z_j)`` = client mean ``- gamma Z_j``, ``Z_j`` i.i.d.
        real Gaussian on the values the cell holds with the Eq. 25 MSE as variance (``noise_model="paper"``,
        docs/decisions.md, "Real AirComp noise") or half of it (``"real_part"``). Noise is drawn per
        coordinate of the full model and cut like the submodel, so both forms see the same noise. Returns each
        cell's per-element MSE.
        """
        radio, lr = self.cfg.radio, self.cfg.optimizer.lr
        mses = []
        for j in range(self.cells.num_cells):
            mse = self.radio.aircomp_mse(t, e, j)
            std = float(np.sqrt(mse / 2 if radio.noise_model == "real_part" else mse))
            gen = torch_rng(self.ctx.seed, "hist-aircomp-noise", t, e, j, device=self.ctx.device)
            for name, value in cell_params.items():
                full = self.params[name]
                noise = torch.randn(full.shape, generator=gen, device=full.device, dtype=full.dtype)
                value[j] -= lr * std * views.cut(name, noise, j)
            mses.append(mse)
        return mses

    def _latency(
        self, values: np.ndarray, cpu: np.ndarray, rates: np.ndarray | None, cell_bits: np.ndarray
    ) -> float:
        """Charge the clock with the global round (Eq. 17-18 with OMA ``rates``, Eq. 35 for AirComp;
        :func:`~fedge.system.cells_round`) and return its seconds; ``cell_bits`` is what one client of
        each cell uploads per edge round (OMA)."""
        cfg, cells = self.cfg, self.cells
        members = [cells.members(j) for j in range(cells.num_cells)]
        work = CellsWork(members, values, self.model_values, cpu, cell_bits, cfg.edge_rounds, cfg.local_steps)
        return self.ctx.system.charge(cells_round(self.ctx.system, work, cfg.radio, rates)).seconds

    def _storage(self, cell_bits: np.ndarray) -> None:
        """What each node holds: the cloud the full model, each edge server and client its submodel."""
        network = self.ctx.network
        network.hold(nodes.CLOUD, "model", {**self.params, **self.buffers})
        for j, bits in enumerate(cell_bits):
            network.hold(nodes.edge(j), "submodel", int(bits))
            network.hold([self.nodes[c] for c in self.cells.members(j)], "model", int(bits))

    def evaluate(self) -> Evaluation:
        return evaluate_model_on(
            self.ctx.cohorts,
            self.model,
            self.params,
            self.buffers,
            self.data.x_test,
            self.data.y_test,
            self.ctx.config.eval.batch_size,
        )
