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

from functools import partial
from typing import Any, ClassVar

import numpy as np
import torch

from fedge.aggregation import Updates, sites
from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.hierarchical.aggregation import EdgeAggregation, check_over_the_air
from fedge.algorithms.hierarchical.cells import Cells, split_data
from fedge.algorithms.hierarchical.config import HierarchicalConfig
from fedge.algorithms.hierarchical.cost import BITS_PER_MB
from fedge.algorithms.hierarchical.devices import CellDevices
from fedge.algorithms.hierarchical.masks import check_cells, partition_layout
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.algorithms.hierarchical.submodel import CellViews, Tensors
from fedge.algorithms.hierarchical.training import local_steps_plan, masked_step
from fedge.algorithms.hierarchical.transfers import CellTransfers
from fedge.comm import nodes
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
from fedge.system import CellsWork, cells_round


class HierarchicalFL(CellTransfers, EdgeAggregation, Algorithm):
    """Cloud, ``N`` edge servers and their clients; subclasses say whether the FC layers are partitioned.

    Its transfers and storage come from :class:`~fedge.algorithms.hierarchical.transfers.CellTransfers`,
    the edge servers' mean or over-the-air estimate from
    :class:`~fedge.algorithms.hierarchical.aggregation.EdgeAggregation`.
    """

    partitioned: ClassVar[bool] = False
    state_fields = ("params", "buffers", "client_up_bits")

    def reads_run_length(self) -> str | None:
        return None  # no round reads config.rounds

    def __init__(self, ctx: Context, cfg: HierarchicalConfig):
        super().__init__(ctx, cfg)
        self.model = ctx.build_model().to(ctx.device)
        self.params = parameters_of(self.model)
        self.buffers = buffers_of(self.model)
        self.layout = partition_layout(self.model) if self.partitioned else ()
        self.cells = Cells.even(ctx.data.num_clients, cfg.cells)
        check_cells(self.layout, cfg.cells)
        self.data = split_data(ctx, cfg, self.cells)
        devices = CellDevices.of(ctx.system.profiles, ctx.config.system, self.cells.size)
        self.radio = CellRadio(cfg.radio, self.cells, ctx.seed, devices)
        if cfg.aggregation == "aircomp":
            check_over_the_air(ctx)
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
        merged = views.merge(cell_params | cell_buffers, partial(self._cloud_mean, t))
        self.params = {k: merged[k] for k in self.params}
        self.buffers = {k: merged[k] for k in self.buffers}
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

    def _cloud_mean(self, t: int, shared: Tensors) -> Tensors:
        """The cloud's aggregation of the cells' shared tensors (stacked ``[N, ...]``), through its
        pipeline: by default their unweighted mean (Eq. 7); the previous global model is the reference."""
        cells = self.cells.num_cells
        weights = torch.full((cells,), 1.0 / cells, dtype=torch.float64, device=self.ctx.device)
        reference = {k: v for k, v in (self.params | self.buffers).items() if k in shared}
        return self.ctx.pipeline(sites.CLOUD).reduce(Updates.of(sites.CLOUD, t, shared, weights, reference))

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
        reference = start_params | start_buffers  # the models the clients started from
        new_params, new_buffers, mses = self._mean(
            t, e, views, clients, uploaded, uploaded_buffers, reference
        )
        return new_params, new_buffers, clients.mean(loss), mses

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

    def _latency(
        self, values: np.ndarray, cpu: np.ndarray, rates: np.ndarray | None, cell_bits: np.ndarray
    ) -> float:
        """Charge the clock with the global round (Eq. 17-18 with OMA ``rates``, Eq. 35 for AirComp;
        :func:`~fedge.system.cells_round`) and return its seconds; ``cell_bits`` is what one client of
        each cell uploads per edge round (OMA)."""
        cfg, cells = self.cfg, self.cells
        members = [cells.members(j) for j in range(cells.num_cells)]
        work = CellsWork(
            members,
            values,
            self.model_values,
            cpu,
            cell_bits,
            cfg.edge_rounds,
            cfg.local_steps,
            self.radio.cell_bandwidth_hz(),
        )
        return self.ctx.system.charge(cells_round(self.ctx.system, work, cfg.radio, rates)).seconds

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
