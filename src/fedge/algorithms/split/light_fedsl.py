"""Lightweight FedSL (Zhang, Ni, Wang; Algorithm 1, Eqs. 2-14): federated split learning with client-side
pruning, quantized client gradients and activation dropout at the cut. The choices the paper leaves open
are in docs/decisions.md ("Lightweight FedSL").

A round is one mini-batch step of every client (Algorithm 1's t):

1. each client runs its trunk on its next mini-batch, drops cut-layer entries with probability ``p``
   (inverted dropout, mask from the seed-shared stream ``(seed, "cut-dropout", t, k)``) and sends the
   kept entries and its labels (``smashed_up``, ``labels_up``; labels at 32 bits, our choice);
2. the server runs its part on every client's batch at the same ``w_s``, returns the cut-layer gradient
   of the kept entries (``grad_down``) and takes one step with the mean of the K server gradients
   (Eq. 7, computed as Eq. 6: K server copies stepped in parallel and averaged, BatchNorm statistics
   too, so server BatchNorm never mixes clients);
3. each client back-propagates, prunes when its sparsity is below the cubic target ``rho_t`` (Eq. 10):
   the ``round(rho_t N)`` weights of least ``|w * g|``, ranked over all conv/linear weights of the
   trunk; the mask persists and masks every later gradient; the masked gradient is stochastically
   quantized to ``q`` bits over the whole flattened client gradient (stream
   ``(seed, "client-quantizer", t, k)``) and applied with plain SGD (Eq. 13);
4. every ``I`` rounds the clients upload their trunks (``model_up``), the server averages them
   uniformly with their BatchNorm buffers (Eq. 14) and broadcasts the mean (``model_down``); each client's
   mask becomes the non-zero pattern of the mean (weights every client pruned stay pruned; the next
   round's trigger prunes the denser mean back to ``rho_t``).

Evaluation uses the virtual average of the client trunks with the server model (the paper names no evaluation
model; docs/decisions.md, "Evaluation on the virtual average"). Clients start from the same initial trunk and
no transfer is counted for it (the paper's initialisation).

Simulated time (our completion; the paper models communication only): per client, forward + backward on its
CPU (FLOPs scaled by ``1 - sparsity``), smashed data and labels up, its server copy's compute, the gradient
down; clients in parallel (the slowest sets the pace). Aggregation rounds add ``max_k`` model upload +
``max_k`` broadcast (``T_agg``). Round metrics report our reading of Fig. 4's latency (smashed data up +
gradient down of the slowest client, ``latency_comm_s``) apart from the aggregation latency
(``latency_agg_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field, PositiveInt

from fedge.algorithms.base import Algorithm, Context, register
from fedge.algorithms.split.flops import count_flops
from fedge.algorithms.split.parts import build_parts, composed, initial_state
from fedge.algorithms.split.pruning import importance_mask, prunable_names, sparsity, sparsity_target
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch, MeanGradientServer
from fedge.comm import apply_dropout, dropout_mask, nodes
from fedge.comm.quantize import quantize_dict
from fedge.config import AlgorithmConfig, SGDConfig
from fedge.data.federated import BatchPlan, FederatedData
from fedge.distributed import send_shard
from fedge.distributed.evaluate import evaluate_sharded
from fedge.engine import SGD, stack_copies, weighted_sum
from fedge.engine.noise import RowKeys
from fedge.engine.split import make_forward
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.rng import numpy_rng, torch_rng
from fedge.system import SplitWork, light_fedsl_round, training_flops
from fedge.tensors import Tensors, floating

LABEL_CODEC = "fp32"  # labels travel at 32 bits each (the paper gives no label size)


class FedSLConfig(AlgorithmConfig):
    """Knobs shared by lightweight FedSL and its baseline, traditional FedSL (Sec. IV).

    - ``batch_size`` per client and round (the paper gives none; 32 suits CPU-sized runs); a round is one
      step.
    - ``drop_last``: an epoch's short last batch is skipped (needed for exact executor agreement with
      BatchNorm, as elsewhere in the engine).
    - ``optimizer``: one constant step size for client and server, plain SGD (Eqs. 7, 13): momentum and
      weight decay are rejected.
    - ``init``: ``torch_default`` or ``normal0.05`` (as the split family); all clients start identical.
    - ``codec_up`` encodes the kept smashed values, ``codec_down`` the returned gradient values;
      ``model_codec`` the client-model uploads and broadcasts: dense ``fp32`` (the default) or
      ``sparse`` (cheapest of bitmap / coordinate list, which pays off on pruned trunks).
    - ``server_order``: on the simulated clock the one server model serves every client's batch as a
      parallel copy (``parallel``, the default) or one upload after another in the order they arrive
      (``arrival``: client compute, uplink and a seeded uniform jitter of up to ``arrival_jitter_s``
      seconds; the queue waits enter the round's time). The model is the same either way (Eq. 7 steps
      once with the mean gradient at one set of weights).
    """

    name: str
    batch_size: PositiveInt = 32
    """samples per client and round (a round is one step)"""
    drop_last: bool = False
    """skip each epoch's short last batch"""
    optimizer: SGDConfig = Field(default_factory=SGDConfig)
    """one constant SGD step size for client and server (no momentum, no decay)"""
    init: Literal["torch_default", "normal0.05"] = "torch_default"
    """torch_default, or normal0.05 (every weight ~ N(0, 0.05^2))"""
    codec_up: Literal["fp32", "fp16"] = "fp32"
    """encoding of uploads (smashed data, labels)"""
    codec_down: Literal["fp32", "fp16"] = "fp32"
    """encoding of downloads (gradients)"""
    model_codec: Literal["fp32", "fp16", "sparse"] = "fp32"
    """encoding of client-model uploads and broadcasts: fp32, fp16 or sparse"""
    server_order: Literal["parallel", "arrival"] = "parallel"
    """the simulated clock: parallel service, or a FIFO queue in simulated arrival order"""
    arrival_jitter_s: Annotated[float, Field(ge=0.0)] = 0.0
    """arrival order: upper end of the seeded uniform jitter added to each upload's arrival (s)"""


class LightFedSLConfig(FedSLConfig):
    """The compression knobs of lightweight FedSL; defaults are the paper's Figs. 3-4 setting.

    - ``final_sparsity`` (rho_f, Eq. 10) reached at round ``schedule_rounds`` (T; default: the run's
      rounds); 0 turns pruning off.
    - ``quant_bits`` (q, Eqs. 11-12), ``null`` or 32 for full precision; ``quant_granularity``: one
      (g_min, g_max) pair for the whole client gradient (``vector``, the paper's) or per tensor.
    - ``cut_dropout`` (p, Eq. 3): element-wise inverted dropout of the cut-layer output, the mask
      from a seed both ends share.
    - ``agg_interval`` (I, Eq. 14): client models are averaged at rounds ``t`` with ``t mod I == 0``.
    """

    name: Literal["light_fedsl"] = "light_fedsl"
    """the algorithm (`fedge list`)"""
    final_sparsity: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.35
    """share of client weights pruned by the end of the schedule (rho_f; 0: off)"""
    schedule_rounds: PositiveInt | None = None
    """round at which pruning reaches final_sparsity (T; default: the run's rounds)"""
    quant_bits: Annotated[int, Field(ge=1, le=32)] | None = 8
    """bits per client-gradient entry (q; null or 32: full precision)"""
    quant_granularity: Literal["vector", "tensor"] = "vector"
    """one quantisation range for the whole gradient (vector) or per tensor"""
    cut_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.3
    """dropout rate of the cut-layer output (p), mask from a shared seed"""
    agg_interval: PositiveInt = 5
    """client models are averaged every this many rounds (I)"""


@dataclass(frozen=True)
class Compression:
    """What lightweight FedSL changes against traditional FedSL, resolved for one run."""

    final_sparsity: float
    schedule_rounds: int
    quant_bits: int | None
    quant_granularity: Literal["vector", "tensor"]
    cut_dropout: float
    agg_interval: int


class StepBatches:
    """Each client's next mini-batch, one per round: its samples in epochs, a fresh shuffle per epoch.

    Client k's epoch e is the shuffle of the stream ``(seed, "batches", e + 1, k, 0)`` (FedAvg's round
    e + 1 batches), cut into ``batch_size`` batches; round t takes batch ``(t - 1) mod steps_k`` of epoch
    ``(t - 1) div steps_k``. Derived from the seed alone, so resumed runs see the same batches.
    """

    def __init__(self, data: FederatedData, batch_size: int, drop_last: bool):
        sizes = data.client_sizes()
        self.steps = sizes // batch_size if drop_last else -(-sizes // batch_size)
        if not self.steps.all():
            smallest = int(sizes.min())
            raise ConfigError(
                "algorithm.batch_size",
                f"{batch_size} exceeds the smallest client ({smallest} samples) with drop_last",
            )
        self.data, self.batch_size, self.drop_last = data, batch_size, drop_last
        self._epochs: dict[int, tuple[int, BatchPlan]] = {}

    def __call__(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample indices ``[K, batch]`` and 0/1 weights (0 pads a short last batch) of round ``t``."""
        index, weight = [], []
        for k, steps in enumerate(self.steps.tolist()):
            epoch, position = divmod(t - 1, steps)
            cached = self._epochs.get(k)
            if cached is None or cached[0] != epoch:
                plan = self.data.batch_plan([k], epoch + 1, 1, self.batch_size, self.drop_last)
                cached = self._epochs[k] = (epoch, plan)
            index.append(cached[1].index[0, position])
            weight.append(cached[1].weight[0, position])
        return torch.stack(index), torch.stack(weight)


@register(
    "light_fedsl",
    LightFedSLConfig,
    "Lightweight FedSL: client pruning, quantized client gradients, cut dropout, aggregation every I rounds",
)
class LightFedSL(Algorithm):
    """Per-client trunks, masks and BatchNorm statistics as stacked state; one server model."""

    cfg: FedSLConfig
    state_fields = ("clients", "server", "totals")
    takes_loss = False

    def __init__(self, ctx: Context, cfg: FedSLConfig):
        super().__init__(ctx, cfg)
        for key, value in (
            ("momentum", cfg.optimizer.momentum),
            ("weight_decay", cfg.optimizer.weight_decay),
        ):
            if value:
                raise ConfigError(f"algorithm.optimizer.{key}", "lightweight FedSL is plain SGD (Eq. 13)")
        if cfg.optimizer.kind != "sgd":
            raise ConfigError("algorithm.optimizer.kind", "lightweight FedSL is plain SGD (Eq. 13)")
        self.knobs = self.compression()
        self.parts = build_parts(ctx, with_aux=False)
        self.prunable = prunable_names(self.parts.trunk, "trunk.")
        if self.knobs.final_sparsity > 0 and not self.prunable:
            raise ConfigError("algorithm.final_sparsity", "the client part has no conv or linear weight")
        client, client_buffers, server, server_buffers = initial_state(self.parts, cfg.init, ctx.seed)
        n = ctx.data.num_clients
        self.clients: dict[str, Tensors] = {
            "params": stack_copies(client, n),
            "buffers": stack_copies(client_buffers, n),
            "masks": stack_copies(
                {name: torch.ones_like(client[name], dtype=torch.bool) for name in self.prunable}, n
            ),
        }
        self.shard = ctx.group.block(n)  # this process's clients (all of them in one process)
        self.server = MeanGradientServer(
            self.parts.server, server, server_buffers, SGD(), None, ctx.executor, group=ctx.group
        )
        self.forward = make_forward(self.parts.trunk)
        self.batches = StepBatches(ctx.data, cfg.batch_size, cfg.drop_last)
        network = ctx.network
        self.up, self.down = network.link(cfg.codec_up), network.link(cfg.codec_down)
        self.labels, self.models = network.link(LABEL_CODEC), network.link(cfg.model_codec)
        self.flops = count_flops(self.parts)
        self.nodes = nodes.clients(range(n))
        self.totals = {"comm_seconds": 0.0, "agg_seconds": 0.0}
        network.hold(nodes.SERVER, "server_model", self.server.storage_bits(n))
        self._client_storage()

    def compression(self) -> Compression:
        """The run's compression settings from the config (traditional FedSL overrides this)."""
        cfg = self.cfg
        bits = None if cfg.quant_bits in (None, 32) else cfg.quant_bits
        total = cfg.schedule_rounds or self.ctx.config.rounds
        return Compression(
            cfg.final_sparsity, total, bits, cfg.quant_granularity, cfg.cut_dropout, cfg.agg_interval
        )

    # ----- one round ---------------------------------------------------------------------------------

    def run_round(self, t: int) -> RoundReport:
        """One step of every client, sharded: this process runs its own clients' (``self.shard``) trunks,
        server copies and updates; sends are sharded, so the ledger and every client's bits are whole
        everywhere. The clients' state ends the round whole on every process: averaged (all-reduce) in
        an aggregation round, gathered otherwise."""
        ctx, knobs, lr, group = self.ctx, self.knobs, self.cfg.optimizer.lr, self.ctx.group
        shard, mine, n = self.shard, self.shard.rows, len(self.nodes)
        rho = sparsity_target(t, knobs.schedule_rounds, knobs.final_sparsity)
        self.parts.model.train()
        index, weight = self.batches(t)
        counts = (weight > 0).sum(dim=1)
        x, y = ctx.data.x_train[index[mine]], ctx.data.y_train[index[mine]]
        before = self._sparsities(self.clients["params"])
        params = {k: v[mine] for k, v in self.clients["params"].items()}
        buffers = {k: v[mine] for k, v in self.clients["buffers"].items()}
        every = ctx.executor.phase_keys(range(n))
        keys = None if every is None else RowKeys(every.base[mine])
        own = counts[mine]
        z, new_buffers, pullback = ctx.executor.forward_with_vjp(
            self.forward, params, buffers, x, own, None if keys is None else keys.at(0)
        )
        keep = self._cut_masks(t, own, z, shard.start)
        dropped = apply_dropout(z.detach(), keep, knobs.cut_dropout)
        smashed = send_shard(
            group, self.up, t, self.nodes, nodes.SERVER, "smashed_up", {"z": dropped}, shard, keep=keep
        )
        labels = send_shard(
            group, self.labels, t, self.nodes, nodes.SERVER, "labels_up", {"y": y}, shard, lengths=own
        )
        server_keys = None if keys is None else keys.at(0, SERVER_STAGE)
        batch = CutBatch(None, smashed.payload["z"], y, own, server_keys, cohort=n)
        served = self.server.serve(batch, lr, True, list(range(len(own))))
        returned = {"g": served.grad_z * keep.to(served.grad_z)}
        grad = send_shard(
            group, self.down, t, nodes.SERVER, self.nodes, "grad_down", returned, shard, keep=keep
        )
        up_bits, down_bits = smashed.bits + labels.bits, grad.bits
        loss = group.gather_rows({"loss": served.loss})["loss"]
        grads = pullback(apply_dropout(grad.payload["g"], keep, knobs.cut_dropout))
        params, masks = self._client_update(t, rho, params, grads, lr)
        trained = {"params": params, "buffers": new_buffers, "masks": masks}
        aggregated = t % knobs.agg_interval == 0
        if aggregated:
            after = group.gather_array(self._sparsities(params))
            model_bits = self._aggregate(t, trained)
        else:
            self.clients = self._gathered(trained)
            after, model_bits = self._sparsities(self.clients["params"]), None
        self._client_storage()
        comm, agg, seconds, wait = self._advance_clock(t, counts, before, up_bits, down_bits, model_bits)
        queue = {} if wait is None else {"queue_wait_s": wait}
        return RoundReport(
            float(loss.double().mean()),
            {
                **queue,
                "rho": rho,
                "sparsity": float(after.mean()),
                "aggregated": float(aggregated),
                "latency_comm_s": comm,
                "latency_agg_s": agg,
                "latency_round_s": seconds,
                "comm_seconds_total": self.totals["comm_seconds"],
                "agg_seconds_total": self.totals["agg_seconds"],
                "lr": lr,
            },
        )

    def _cut_masks(self, t: int, counts: torch.Tensor, z: torch.Tensor, first: int) -> torch.Tensor:
        """0/1 keep masks of the cut-layer entries, ``[K, batch, ...]``, from each client's shared stream;
        row i is client ``first + i``.

        Drawn per client on its real rows (padding rows stay 0), so both executors use the same masks.
        """
        keep = torch.zeros_like(z)
        p = self.knobs.cut_dropout
        for i, count in enumerate(counts.tolist()):
            if count:
                gen = torch_rng(self.ctx.seed, "cut-dropout", t, first + i, device=z.device)
                keep[i, :count] = dropout_mask((count, *z.shape[2:]), p, gen, device=z.device).to(z)
        return keep

    def _client_update(
        self, t: int, rho: float, params: Tensors, grads: Tensors, lr: float
    ) -> tuple[Tensors, Tensors]:
        """Prune where the sparsity is below ``rho``, mask, quantize and take the SGD step (Eqs. 8-13) for
        this process's clients (``params`` and ``grads`` hold their rows); returns their new parameters
        and masks.

        The importance uses this round's gradient at the unpruned weights (pruning follows the backward
        pass). A client that does not prune keeps its mask, so its pruned weights stay zero.
        """
        knobs, first = self.knobs, self.shard.start
        masks = {name: mask[self.shard.rows].clone() for name, mask in self.clients["masks"].items()}
        if rho > 0:
            count = round(rho * sum(params[name][0].numel() for name in self.prunable))
            for k in range(len(self.shard)):
                weights = {name: params[name][k] for name in self.prunable}
                if sparsity(weights) < rho:
                    fresh = importance_mask(weights, {name: grads[name][k] for name in self.prunable}, count)
                    for name, mask in fresh.items():
                        masks[name][k] = mask.bool()
        params, grads = dict(params), dict(grads)
        for name, mask in masks.items():
            params[name] = params[name] * mask.to(params[name])
            grads[name] = grads[name] * mask.to(grads[name])
        if knobs.quant_bits is not None:
            rows = [
                quantize_dict(
                    {name: g[k] for name, g in grads.items()},
                    knobs.quant_bits,
                    torch_rng(self.ctx.seed, "client-quantizer", t, first + k, device=self.ctx.device),
                    knobs.quant_granularity,
                )
                for k in range(len(self.shard))
            ]
            grads = {name: torch.stack([r[name] for r in rows]) for name in grads}
        return {name: p - lr * grads[name] for name, p in params.items()}, masks

    def _gathered(self, trained: dict[str, Tensors]) -> dict[str, Tensors]:
        """Every client's state from each process's rows of it (rank order is client order); masks
        travel as bytes."""
        group = self.ctx.group
        masks = group.gather_rows({k: m.to(torch.uint8) for k, m in trained["masks"].items()})
        return {
            "params": group.gather_rows(trained["params"]),
            "buffers": group.gather_rows(trained["buffers"]),
            "masks": {k: m.bool() for k, m in masks.items()},
        }

    def _aggregate(self, t: int, trained: dict[str, Tensors]) -> tuple[np.ndarray, np.ndarray]:
        """Upload every trunk, average uniformly (BatchNorm buffers too), broadcast, and recompute the masks
        as the non-zero pattern of the mean.

        Resetting the masks to all ones would let the first unmasked gradient revive every pruned weight
        whenever the mean already sits at the target count (no pruning triggers then); a mask taken from
        the mean keeps its zeros masked, and the importance sort ranks them first when the next trigger
        prunes further, so masks stay nested. Returns the upload and broadcast bits per client.

        ``trained`` holds this process's clients (``self.shard``): it uploads and sums them, one
        all-reduce adds the sums, and every process then holds every client's state.
        """
        n, group, shard = len(self.nodes), self.ctx.group, self.shard
        params, buffers = trained["params"], trained["buffers"]
        sent = {**params, **floating(buffers)}
        up = send_shard(group, self.models, t, self.nodes, nodes.SERVER, "model_up", sent, shard)
        self.ctx.network.hold(nodes.SERVER, "client_models", int(up.bits.sum()))
        uniform = torch.full((len(shard),), 1.0 / n, dtype=torch.float64, device=self.ctx.device)
        received = {k: up.payload.get(k, v) for k, v in {**params, **buffers}.items()}
        summed = group.sum_tensors(weighted_sum(received, uniform))
        mean_params = {k: summed[k] for k in params}
        mean_buffers = {k: summed[k] for k in buffers}
        mean = {**mean_params, **floating(mean_buffers)}
        down = self.models.send(t, nodes.SERVER, self.nodes, "model_down", mean)
        down_bits = np.repeat(down.bits, n)
        params = stack_copies({k: down.payload[k] for k in mean_params}, n)
        self.clients = {
            "params": params,
            "buffers": stack_copies({k: down.payload.get(k, v) for k, v in mean_buffers.items()}, n),
            "masks": {
                name: params[name] != 0
                if self.knobs.final_sparsity > 0
                else torch.ones_like(params[name], dtype=torch.bool)
                for name in self.clients["masks"]
            },
        }
        return up.bits, down_bits

    def _advance_clock(
        self,
        t: int,
        counts: torch.Tensor,
        sparsities: np.ndarray,
        up_bits: np.ndarray,
        down_bits: np.ndarray,
        model_bits: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[float, float, float, float | None]:
        """Advance the clock by the round; return the Fig. 4 latency, ``T_agg``, the round's seconds and
        (``server_order: arrival``) the uploads' total queue wait."""
        system, clients = self.ctx.system, np.arange(len(self.nodes))
        samples = counts.cpu().numpy().astype(np.float64)
        client = training_flops(self.flops.trunk, samples) * (1.0 - sparsities)
        work = SplitWork(clients, up_bits, down_bits, client, training_flops(self.flops.server, samples))
        jitter = None
        if self.cfg.server_order == "arrival":
            jitter = numpy_rng(self.ctx.seed, "arrival-jitter", t, 0).uniform(
                0.0, self.cfg.arrival_jitter_s, len(clients)
            )
        done = light_fedsl_round(system, t, work, model_bits, jitter)
        system.charge(done.cost)
        self.totals["comm_seconds"] += done.comm
        self.totals["agg_seconds"] += done.agg
        return done.comm, done.agg, done.cost.seconds, done.wait

    def _sparsities(self, params: Tensors) -> np.ndarray:
        """Each row's realised sparsity (exact zeros over its prunable weights) of stacked ``params``."""
        rows = next(iter(params.values())).shape[0]
        return np.array(
            [
                sparsity({name: params[name][k] for name in self.prunable}) if self.prunable else 0.0
                for k in range(rows)
            ]
        )

    def _client_storage(self) -> None:
        """Each client holds its trunk (encoded by ``model_codec``, so a sparse code shows the pruning)
        and, with pruning, its mask at one bit per prunable weight."""
        params, buffers = self.clients["params"], self.clients["buffers"]
        self.models.store(self.nodes, "model", {**params, **floating(buffers)}, stacked=True)
        if self.knobs.final_sparsity > 0:
            mask_bits = sum(m[0].numel() for m in self.clients["masks"].values())
            self.ctx.network.hold(self.nodes, "mask", mask_bits)

    # ----- evaluation and state ----------------------------------------------------------------------

    @property
    def client(self) -> dict[str, Tensors]:
        """The virtual average of the client trunks (uniform, BatchNorm statistics included)."""
        n = len(self.nodes)
        uniform = torch.full((n,), 1.0 / n, dtype=torch.float64, device=self.ctx.device)
        return {key: weighted_sum(self.clients[key], uniform) for key in ("params", "buffers")}

    def evaluate(self) -> Evaluation:
        """The virtual average of the client trunks + the server model on the test set, dropout off; also
        that model's sparsity (aggregation lowers it when the clients' masks differ)."""
        data, client = self.ctx.data, self.client
        params = composed(client["params"], self.server.params)
        buffers = composed(client["buffers"], self.server.buffers)
        evaluation = evaluate_sharded(
            self.ctx.group, self.parts.model, params, buffers, data.x_test, data.y_test,
            self.ctx.config.eval.batch_size,
        )  # fmt: skip
        prunable = {name: client["params"][name] for name in self.prunable}
        return evaluation.with_extra(model_sparsity=sparsity(prunable) if prunable else 0.0)
