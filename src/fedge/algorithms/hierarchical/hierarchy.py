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

Privacy: with AirComp and ``radio.clip`` every client's transmitted accumulated gradient is clipped to
that L2 norm, and each cell's over-the-air aggregate of each edge round is recorded on the privacy ledger
as the Gaussian mechanism its receiver noise makes of it (:mod:`fedge.privacy.air`), with the noise
multiplier of that edge round's channels and beamformer.

Adversary: malicious members poison the uploads their edge server receives, per cell, before AirComp's
clip and the edge's pipeline (:mod:`fedge.runtime.cell_adversary`); the round reports ``malicious`` and
``malicious_kept``. Malicious edge servers poison their upload to the cloud after the cloud decoded it
(:mod:`fedge.runtime.edge_adversary`); the round reports ``malicious_edges`` and
``malicious_edges_kept``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch

from fedge.aggregation import sites
from fedge.aggregation.fltrust import FLTrust, RootUpdate
from fedge.algorithms.base import Algorithm, Context
from fedge.algorithms.hierarchical.aggregation import check_over_the_air, over_the_air
from fedge.algorithms.hierarchical.cells import split_data
from fedge.algorithms.hierarchical.config import HierarchicalConfig
from fedge.algorithms.hierarchical.cost import BITS_PER_MB
from fedge.algorithms.hierarchical.devices import CellDevices
from fedge.algorithms.hierarchical.masks import check_cells, partition_layout
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.algorithms.hierarchical.submodel import CellViews, Tensors, apply_valid
from fedge.algorithms.hierarchical.training import local_steps_plan, masked_step
from fedge.distributed.evaluate import evaluate_model_on
from fedge.engine import ClientBank, buffers_of, classification_loss, make_optimizer, make_step, parameters_of
from fedge.engine.private_step import PrivateStep, private_step
from fedge.engine.step import Step
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.privacy.air import aircomp_releases
from fedge.privacy.peer import clip_rows, flat_rows
from fedge.runtime.adversary import Adversary
from fedge.runtime.edge_adversary import EdgeAdversary
from fedge.runtime.hierarchy import CellLinks, Cells, CellsRound, CellsRuntime
from fedge.runtime.root import cloud_root_data, edge_root_data
from fedge.system import forward_flops, training_flops

HierarchicalT = TypeVar("HierarchicalT", bound=HierarchicalConfig)


class HierarchicalFL(Algorithm[HierarchicalT], Generic[HierarchicalT]):
    """Cloud, ``N`` edge servers and their clients; subclasses say whether the FC layers are partitioned.

    The round's transfers, training rows, aggregations, clock and storage are the cells runtime's
    (:class:`~fedge.runtime.hierarchy.CellsRound`); AirComp's edge reducer is
    :func:`~fedge.algorithms.hierarchical.aggregation.over_the_air`.
    """

    partitioned: ClassVar[bool] = False
    state_fields = ("params", "buffers", "client_up_bits")

    def reads_run_length(self) -> str | None:
        return None  # no round reads config.rounds

    def __init__(self, ctx: Context, cfg: HierarchicalT):
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
        if cfg.radio.clip is not None:
            self._check_clip(cfg)
        self.sgd = make_optimizer(cfg.optimizer)
        plain = make_step(classification_loss(self.model, ctx.criterion), self.sgd)
        self.plain_step = private_step(plain, ctx.privacy, self.model)
        self.step = masked_step(self.plain_step, self.layout)
        self.root_step = masked_step(plain, self.layout)  # FLTrust's at the edges: no DP-SGD
        network = ctx.network
        self.links = CellLinks(
            network.link(cfg.codec_up),
            network.link(cfg.codec_down),
            network.link(cfg.codec_edge_up),
            network.link(cfg.codec_edge_down),
            analogue=cfg.aggregation == "aircomp",
        )
        cloud = ctx.pipeline(sites.CLOUD).reducer
        if self.partitioned and isinstance(cloud, FLTrust):
            raise ConfigError(
                f"{cloud.run.key}.at",
                "fltrust at HIST's cloud could score only the shared tensors, each neuron having one owner:"
                " set at: [edge]",
            )
        edges = EdgeAdversary.of(ctx.config.adversary, self.cells.num_cells, ctx.seed)
        self.rounds = CellsRuntime(ctx, self.cells, self.links, self._adversary(), edges)
        self.model_values = sum(p.numel() for p in self.params.values())
        self.client_up_bits = np.zeros(self.cells.size, dtype=np.int64)

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
        rnd = self.rounds.open(t, views)
        sent = views.gather(self.params), views.gather(self.buffers)
        cell_params, cell_buffers = rnd.send_cells(False, *sent)
        losses, mses = [], []
        for e in range(cfg.edge_rounds):
            cell_params, cell_buffers, loss, mse = self._edge_round(rnd, e, views, cell_params, cell_buffers)
            losses.append(loss)
            mses.extend(mse)
        cell_params, cell_buffers = rnd.send_cells(True, cell_params, cell_buffers)
        cell_params, cell_buffers = rnd.poison_edges(cell_params, cell_buffers, sent)
        shared = sum(v.numel() for k, v in self.params.items() if k not in views.roles)
        owned = views.values(self.params) - shared  # the neurons' values each cell alone holds
        cloud = self.ctx.pipeline(sites.CLOUD).reducer
        if isinstance(cloud, FLTrust):
            cloud.root = self._cloud_root(t, cloud)
        merged = views.merge(
            cell_params | cell_buffers, partial(rnd.cloud, model=self.params | self.buffers, owned=owned)
        )
        self.params = {k: merged[k] for k in self.params}
        self.buffers = {k: merged[k] for k in self.buffers}
        self.client_up_bits += rnd.client_bits
        latency = rnd.close(
            views.values(self.params),
            self.model_values,
            cpu,
            cfg.edge_rounds,
            cfg.local_steps,
            self.radio.cell_bandwidth_hz(),
            cfg.radio,
            rates,
            model=self.params | self.buffers,
        )
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
        metrics.update(rnd.figures())
        return RoundReport(float(torch.stack(losses).double().mean()), metrics)

    def _edge_round(
        self, rnd: CellsRound, e: int, views: CellViews, cell_params: Tensors, cell_buffers: Tensors
    ) -> tuple[Tensors, Tensors, torch.Tensor, list[float]]:
        """Edge round ``e`` in every cell: the edge servers broadcast, their clients take ``H`` local
        steps (this process's rows) and upload, and the edge servers aggregate (Algorithm 1's inner loop).
        """
        cfg, t = self.cfg, rnd.round
        start_params, start_buffers = rnd.broadcast(cell_params, cell_buffers)
        bank = rnd.bank(start_params, start_buffers, partial(self._opt_state, views))
        data = rnd.training(self.data)
        plan = local_steps_plan(
            data, bank.clients, t, e, cfg.local_steps, cfg.batch_size, cohort=range(self.cells.size)
        )
        self.model.train()
        loss = rnd.train(self._step(views), bank, plan, data, cfg.optimizer.lr)
        uploaded, uploaded_buffers = rnd.collect(bank)
        uploaded, uploaded_buffers = rnd.poison(e, uploaded, uploaded_buffers, (start_params, start_buffers))
        reference = start_params | start_buffers  # the models the clients started from
        air = None
        if cfg.aggregation == "aircomp":
            clip = cfg.radio.clip
            if clip is not None:
                uploaded = self._clipped(rnd, uploaded, start_params, clip)
            air = over_the_air(rnd.edge_reducer, cfg, self.radio, self.ctx, self.params, t, e, views)
            if clip is not None:
                members = [self.cells.members(j).tolist() for j in range(self.cells.num_cells)]
                real_part = cfg.radio.noise_model == "real_part"
                for release in aircomp_releases(t, air.mses, members, clip, real_part):
                    self.ctx.privacy.record(release)
        if isinstance(rnd.edge_reducer, FLTrust):
            rnd.edge_reducer.root = self._roots(
                rnd, e, views, (start_params, start_buffers), rnd.edge_reducer
            )
        new_params, new_buffers = rnd.aggregate(uploaded, uploaded_buffers, reference, air)
        if views.layout:  # a stage's noise on the foreign slots, which no client trains or sends: dropped
            new_params = apply_valid(new_params, views.layout, list(views.valid))
        return new_params, new_buffers, rnd.mean(loss), list(air.mses) if air is not None else []

    def _roots(
        self, rnd: CellsRound, e: int, views: CellViews, start: tuple[Tensors, Tensors], reducer: FLTrust
    ) -> RootUpdate:
        """FLTrust at the edges (Cao et al., NDSS 2021): each edge server's own model of edge round ``e``,
        trained from the model it broadcast to its cell (``start``, stacked per cell) on its root set as
        its members train: ``local_steps`` steps of their batch size, the masked step on HIST's submodel,
        a fresh optimizer state, DP-SGD left out (the set is the edge's own), on the run's executor as
        rows keyed past every client id; its FLOPs are charged to the edge with the aggregation's."""
        cfg, data, n = self.cfg, self.ctx.data, self.cells.num_cells
        roots = edge_root_data(data, self.ctx.seed, reducer.root_samples, n, reducer.run.key)
        params, buffers = ({k: v.clone() for k, v in part.items()} for part in start)
        cells = torch.arange(n, device=self.ctx.device)
        ids = tuple(data.num_clients + j for j in range(n))
        bank = ClientBank(ids, params, buffers, self._opt_state(views, params, cells))
        steps, batch = cfg.local_steps, cfg.batch_size
        plan = local_steps_plan(roots, range(n), rnd.round, e, steps, batch, purpose="fltrust-root-batches")
        self.model.train()
        self.ctx.executor.train(
            self.root_step, bank, plan, roots, cfg.optimizer.lr if reducer.lr is None else reducer.lr
        )
        flops = training_flops(forward_flops(self.model, data.input_shape), float(plan.weight.sum()) / n)
        return RootUpdate({**bank.params, **bank.buffers}, float(flops), per_output=True)

    def _cloud_root(self, t: int, reducer: FLTrust) -> RootUpdate:
        """FLTrust at HFedAvg's cloud: the cloud's own model of round ``t``, trained from the global model
        on its root set (:func:`~fedge.runtime.root.cloud_root_data`) for one edge period, ``edge_rounds
        x local_steps`` steps of the members' batch size (a fresh optimizer state, DP-SGD left out), so
        that its update spans what an edge's upload does; batches from ``(seed,
        "fltrust-root-cloud-batches-0", round, 0, epoch)``, on the run's executor as one row keyed past
        every edge's; its FLOPs are charged to the cloud with the aggregation's."""
        cfg, data, n = self.cfg, self.ctx.data, self.cells.num_cells
        root = cloud_root_data(data, self.ctx.seed, reducer.root_samples, reducer.run.key)
        state = self.sgd.init(self.params)
        bank = ClientBank.broadcast([data.num_clients + n], self.params, self.buffers, state)
        steps = cfg.edge_rounds * cfg.local_steps
        plan = local_steps_plan(root, [0], t, 0, steps, cfg.batch_size, purpose="fltrust-root-cloud-batches")
        self.model.train()
        self.ctx.executor.train(
            self.root_step, bank, plan, root, cfg.optimizer.lr if reducer.lr is None else reducer.lr
        )
        flops = training_flops(forward_flops(self.model, data.input_shape), float(plan.weight.sum()))
        return RootUpdate({k: v[0] for k, v in {**bank.params, **bank.buffers}.items()}, float(flops))

    def _adversary(self) -> Adversary | None:
        """The run's adversary among the active clients (a fraction of them; listed ids must be active:
        the last ``K mod N`` clients are in no cell); none where only edge servers are malicious."""
        ctx, config = self.ctx, self.ctx.config.adversary
        if config is not None and config.clients is None:
            return None
        if config is not None and isinstance(config.clients, list) and max(config.clients) >= self.cells.size:
            idle = f"client {max(config.clients)} is in no cell ({self.cells.size} active clients)"
            raise ConfigError("adversary.clients", idle)
        return Adversary.of(config, self.data, ctx.seed, ctx.cohorts.processes, spread=True)

    def _check_clip(self, cfg: HierarchicalT) -> None:
        """``radio.clip`` bounds AirComp's transmissions; the channel noise covers the parameters only, so
        a model whose floating buffers (BatchNorm statistics) go over the air with them is refused."""
        if cfg.aggregation != "aircomp":
            raise ConfigError(
                "algorithm.radio.clip", "bounds AirComp's transmissions: set aggregation: aircomp"
            )
        if any(v.is_floating_point() for v in self.buffers.values()):
            raise ConfigError(
                "algorithm.radio.clip",
                f"{self.model.name}'s floating buffers reach the edge without channel noise: no guarantee",
            )

    def _clipped(self, rnd: CellsRound, uploaded: Tensors, start: Tensors, clip: float) -> Tensors:
        """The uploads (this process's rows) with each client's accumulated gradient, ``(start - model) /
        lr`` over all its parameters, clipped to L2 norm ``clip`` (what it transmits over the air)."""
        lr, names = self.cfg.optimizer.lr, list(uploaded)
        own_start = {k: start[k][rnd.local_cells] for k in names}
        flat_start = flat_rows(own_start, names)
        step = clip_rows(flat_start - flat_rows(uploaded, names), lr * clip)
        out, offset = {}, 0
        for k in names:
            size = uploaded[k][0].numel()
            out[k] = own_start[k] - step[:, offset : offset + size].reshape(uploaded[k].shape)
            offset += size
        return out

    def _opt_state(self, views: CellViews, params: Tensors, cell_of: torch.Tensor) -> Tensors:
        """Fresh optimizer state of clients with ``params`` in cells ``cell_of``, carrying their slot
        masks (what the masked step reads)."""
        return {**self.sgd.init(params, rows=len(cell_of)), **views.client_valid(cell_of)}

    def _step(self, views: CellViews) -> Step | PrivateStep:
        """The masked step, or the plain one when every slot is real (equal cells, compact form):
        masking then multiplies by one, so the plain step gives the same numbers without the products."""
        padded = any(not bool(v.all()) for v in views.valid)
        return self.step if padded else self.plain_step

    def evaluate(self) -> Evaluation:
        """The cloud model's test figures, with a backdoor's attack success rate under one."""
        batch, adversary = self.ctx.config.eval.batch_size, self.rounds.adversary
        plain = evaluate_model_on(
            self.ctx.cohorts, self.model, self.params, self.buffers, self.data.x_test, self.data.y_test, batch
        )
        if adversary is None:
            return plain
        return plain.with_extra(**adversary.success(self.model, self.params, self.buffers, self.data, batch))
