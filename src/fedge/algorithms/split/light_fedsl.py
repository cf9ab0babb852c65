"""Lightweight FedSL (Zhang, Ni, Wang; Algorithm 1, Eqs. 2-14): federated split learning with client-side
pruning, quantized client gradients and activation dropout at the cut. The choices the paper leaves open
are in docs/decisions.md ("Lightweight FedSL"). Its one named baseline, traditional FedSL (``fedsl``,
:class:`FedSL`), is the same round with every compression off.

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

On a LoRA transformer (docs/llm.md) the same steps act on token activations and adapters: the dropout mask
is element-wise over ``batch x sequence x hidden``, the pruned and quantized client weights are the client
part's adapters ``A`` and ``B``, and ``codec_down: q<bits>`` sends the cut-layer gradient quantized (the
paper quantizes only the local update; this is our extension for the link). Pruned adapters save no
simulated client compute: the frozen base, dense, does nearly all of it.

``privacy.cut``, ``privacy.labels`` and ``privacy.sample`` act inside steps 1-3; where, and why the
compression around them keeps their guarantee, is in :mod:`~fedge.algorithms.split.fedsl_privacy`.

An ``adversary`` (:mod:`~fedge.runtime.split_adversary`) acts as in the other split algorithms: a
malicious client sends flipped labels (``label_flip``), poisons its kept cut entries after dropout and
``privacy.cut``, before the up link encodes them (``smashed_noise``, ``smashed_flip``; step 0, dropped
entries stay dropped), and its uploaded trunk is poisoned at receipt in aggregation rounds, before the
server's pipeline, the last broadcast trunk as the reference (model poisoning; ``malicious_kept`` is
reported there). ``backdoor`` is refused: the round's batches index the run's samples, not a backdoor's
stamped copies; nor does the adversary deploy (``fedge deploy`` refuses it).

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

from abc import abstractmethod

import numpy as np
import torch

from fedge.algorithms.base import Algorithm, Context, register
from fedge.algorithms.split.config import SPLIT_BATCHED_FROM
from fedge.algorithms.split.copies import MeanGradientServer
from fedge.algorithms.split.cost import count_flops
from fedge.algorithms.split.fedsl_averaging import Averaging
from fedge.algorithms.split.fedsl_client import ClientUpdate, cut_masks
from fedge.algorithms.split.fedsl_config import (
    Compression,
    FedSLConfig,
    LightFedSLConfig,
    TraditionalFedSLConfig,
)
from fedge.algorithms.split.fedsl_privacy import FedSLPrivacy
from fedge.algorithms.split.fedsl_steps import CutStep, ServedCut, StepBatches, Trained
from fedge.algorithms.split.padding import sent_entries, sent_targets
from fedge.algorithms.split.parts import build_parts, composed, initial_state
from fedge.algorithms.split.pruning import prunable_names, sparsity, sparsity_target
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch
from fedge.comm import apply_dropout, nodes
from fedge.distributed.evaluate import evaluate_model_on
from fedge.engine import SGD, stack_copies, weighted_sum
from fedge.engine.noise import RowKeys
from fedge.engine.split import make_forward
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.models.lora import ADAPTERS
from fedge.rng import numpy_rng
from fedge.runtime.split import SplitRuntime
from fedge.runtime.split_adversary import SplitAdversary
from fedge.system import SplitWork, light_fedsl_round, training_flops
from fedge.tensors import Tensors, floating

__all__ = ["Compression", "FedSLConfig", "FedSLRounds", "LightFedSL", "LightFedSLConfig"]

LABEL_CODEC = "fp32"  # labels travel at 32 bits each (the paper gives no label size)


class FedSLRounds(Algorithm[FedSLConfig]):
    """The round lightweight FedSL and its traditional baseline share: per-client trunks, masks and
    BatchNorm statistics as stacked state, one server model; a subclass says which compression the
    round runs (:meth:`compression`)."""

    state_fields: tuple[str, ...] = ("clients", "server", "totals")
    takes_loss = False
    batched_from = SPLIT_BATCHED_FROM
    recorded = frozenset({"smashed", "cut_gradients", "labels"})  # the one exchange of a round

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
        self.adapters_only = any(name.rsplit(".", 1)[1] in ADAPTERS for name in self.prunable)
        if self.knobs.final_sparsity > 0 and not self.prunable:
            weightless = "the client part has no trained conv, linear or adapter weight"
            raise ConfigError("algorithm.final_sparsity", weightless)
        client, client_buffers, server, server_buffers = initial_state(self.parts, cfg.init, ctx.seed)
        n = ctx.data.num_clients
        self.runtime = SplitRuntime(ctx)
        self.clients: dict[str, Tensors] = {
            "params": stack_copies(client, n),
            "buffers": stack_copies(client_buffers, n),
            "masks": stack_copies(
                {name: torch.ones_like(client[name], dtype=torch.bool) for name in self.prunable}, n
            ),
        }
        self.cohort = self.runtime.clients(n)  # the clients this process runs (all of them in one process)
        self.server = MeanGradientServer(self.parts.server, server, server_buffers, SGD(), None, ctx.executor)
        self.update = ClientUpdate(self.knobs, self.prunable, ctx.seed, ctx.device)
        self.forward = make_forward(self.parts.trunk)
        self.privacy = FedSLPrivacy.of(ctx, self.parts, self.forward)  # None: no mechanism configured
        if self.privacy is not None:  # which clients' labels went out travels in the checkpoint
            self.state_fields = (*self.state_fields, "privacy")
        self.sent_labels = ctx.data.y_train if self.privacy is None else self.privacy.sent_labels
        self.batches = StepBatches(ctx.data, cfg.batch_size, cfg.drop_last)
        network = ctx.network
        self.up, self.down = network.link(cfg.codec_up), network.link(cfg.codec_down)
        self.labels, self.models = network.link(LABEL_CODEC), network.link(cfg.model_codec)
        self.flops = count_flops(self.parts)
        self.nodes = nodes.clients(range(n))
        pruned = self.knobs.final_sparsity > 0
        self.averaging = Averaging(self.runtime, self.models, self.cohort, self.nodes, pruned)
        self.totals = {"comm_seconds": 0.0, "agg_seconds": 0.0}
        self.adversary = self._adversary(ctx, {**client, **client_buffers})
        self.runtime.store(nodes.SERVER, "server_model", self.server.storage_bits(n))
        self._client_storage()

    def _adversary(self, ctx: Context, initial: Tensors) -> SplitAdversary | None:
        """The run's malicious clients (the config refuses a ``backdoor``); with them, the last broadcast
        trunk and buffers (``reference``, model poisoning's) travel in the checkpoint."""
        adversary = SplitAdversary.of_run(ctx)
        if adversary is None:
            return None
        self.averaging.adversary = adversary
        self.reference = {k: v.clone() for k, v in initial.items()}
        self.state_fields = (*self.state_fields, "reference")
        return adversary

    @abstractmethod
    def compression(self) -> Compression:
        """The run's compression settings: pruning, gradient quantization, cut dropout, aggregation
        interval."""

    def reads_run_length(self) -> str | None:
        if self.knobs.final_sparsity == 0:  # traditional FedSL: no pruning
            return None
        return (
            f"{self.name}'s pruning reaches final_sparsity at the run's last round (Eq. 10's T); set "
            "algorithm.schedule_rounds to fix T"
        )

    # ----- one round ---------------------------------------------------------------------------------

    def run_round(self, t: int) -> RoundReport:
        """One step of every client (Algorithm 1's t). This process runs its own clients' trunks, server
        copies and updates (the run's client cohort); the cohort's sends keep the ledger and every
        client's bits whole everywhere. The clients' state ends the round whole on every process:
        averaged (all-reduce) in an aggregation round, gathered otherwise."""
        knobs, lr = self.knobs, self.cfg.optimizer.lr
        rho = sparsity_target(t, knobs.schedule_rounds, knobs.final_sparsity)
        self.parts.model.train()
        first = {k: v[0] for k, v in self.clients["params"].items()}  # the averaged trunk every client holds
        self.ctx.recorder.model("client_model", first, {k: v[0] for k, v in self.clients["buffers"].items()})
        index, weight = self.batches(t)
        counts = (weight > 0).sum(dim=1)
        if self.privacy is not None:
            self.privacy.record(t, self.batches.epoch_samples(t))
        before = self._sparsities(self.clients["params"])
        step = self.client_steps(t, rho, index, counts)
        trained = step.states
        aggregated = t % knobs.agg_interval == 0
        if aggregated:
            after = self.runtime.gather_array(self.cohort, self._sparsities(trained["params"]))
            model_bits = self._aggregate(t, trained)
            attacked = self.averaging.figures
        else:
            self.clients = self._gathered(trained)
            after, model_bits = self._sparsities(self.clients["params"]), None
            attacked = self._malicious(t)
        self._client_storage()
        bits = (step.up_bits, step.down_bits, model_bits)
        comm, agg, seconds, wait = self._advance_clock(t, counts, before, *bits)
        figures = {
            **({} if wait is None else {"queue_wait_s": wait}),
            "rho": rho, "sparsity": float(after.mean()), "aggregated": float(aggregated),
            "latency_comm_s": comm, "latency_agg_s": agg, "latency_round_s": seconds,
            "comm_seconds_total": self.totals["comm_seconds"],
            "agg_seconds_total": self.totals["agg_seconds"], "lr": lr, **attacked,
        }  # fmt: skip
        return RoundReport(float(step.loss.double().mean()), figures)

    def client_steps(self, t: int, rho: float, index: torch.Tensor, counts: torch.Tensor) -> Trained:
        """Steps 1-3 of the round for this process's clients: the cut exchange, then each client's
        update (prune to ``rho``, mask, quantize, step)."""
        own, cohort = self.runtime.local_rows, self.cohort
        masks = {name: own(cohort, mask) for name, mask in self.clients["masks"].items()}
        cut = self._cut_exchange(t, index, counts, masks)
        lr, first = self.cfg.optimizer.lr, self.runtime.first_row(cohort)
        params, masks = self.update(t, rho, cut.params, cut.grads, masks, lr, first)
        states = {"params": params, "buffers": cut.buffers, "masks": masks}
        return Trained(states, cut.loss, cut.up_bits, cut.down_bits)

    def _cut_exchange(self, t: int, index: torch.Tensor, counts: torch.Tensor, masks: Tensors) -> CutStep:
        """Steps 1-2 of the round for this process's clients (``masks``: their pruning masks): trunk
        forward, cut dropout, the server's side (:meth:`server_side`), the returned gradient
        back-propagated through the trunk (under ``privacy.sample`` each sample's, as DP-SGD;
        :mod:`~fedge.algorithms.split.fedsl_privacy` says in which order the mechanisms act)."""
        ctx, cohort, runtime, privacy = self.ctx, self.cohort, self.runtime, self.privacy
        p, mine, first = self.knobs.cut_dropout, runtime.local_rows(cohort, index), runtime.first_row(cohort)
        data = ctx.data if self.adversary is None else self.adversary.data(t, ctx.data)
        labels = self.sent_labels if data is ctx.data else data.y_train  # label_flip: the flipped ones
        x, y = ctx.data.x_train[mine], labels[mine]
        params = {k: runtime.local_rows(cohort, v) for k, v in self.clients["params"].items()}
        buffers = {k: runtime.local_rows(cohort, v) for k, v in self.clients["buffers"].items()}
        every = ctx.executor.phase_keys(range(len(self.nodes)))
        keys = None if every is None else RowKeys(runtime.local_rows(cohort, every.base))
        own = runtime.local_rows(cohort, counts)
        private = privacy is not None and privacy.sample is not None
        if private:  # the per-sample gradients come later: one forward pass without a graph to send
            with torch.no_grad():
                out = ctx.executor.map(
                    self.forward, state=(buffers,), batch=(x,), shared=(), counts=own, inputs=(params,),
                    stage="forward",
                )  # fmt: skip
            z, new_buffers = out.per_sample[0], out.state[0]
        else:
            z, new_buffers, pullback = ctx.executor.forward_with_vjp(
                self.forward, params, buffers, x, own, None if keys is None else keys.at(0)
            )
        keep = cut_masks(ctx.seed, t, own, z, first, p)
        sent, through = apply_dropout(z.detach(), keep, p), None
        if privacy is not None:
            sent, through = privacy.released(t, first, sent, keep, own)
        if self.adversary is not None:  # as the malicious clients send it, dropped entries still dropped
            clients = runtime.local_row_ids(cohort)
            poisoned = self.adversary.smashed(t, clients, np.zeros_like(clients), 0, sent, own)
            sent = poisoned * keep.to(poisoned)
        served = self.server_side(t, sent, y, own, keep, keys, samples=mine)
        grad = served.grad if through is None else through(served.grad)
        if privacy is not None and private:
            state = (params, buffers, masks)
            grads = privacy.gradient(ctx.executor, t, first, state, x, apply_dropout(grad, keep, p), own)
        else:
            grads = pullback(apply_dropout(grad, keep, p))
        return CutStep(params, new_buffers, grads, served.loss, served.up_bits, served.down_bits)

    def server_side(
        self, t: int, dropped: torch.Tensor, y: torch.Tensor, own: torch.Tensor, keep: torch.Tensor,
        keys: RowKeys | None, samples: torch.Tensor | None = None,
    ) -> ServedCut:  # fmt: skip
        """Step 2 for this process's clients: their kept cut entries (``dropped``, dropout applied) and
        labels up, the server's mean-gradient step, the kept entries' gradient down, as received. A
        padded sequence's pad positions are not sent either (:mod:`~fedge.algorithms.split.padding`).
        ``samples``: the rows' training-sample indices, for the run's recorder (``output.record``)."""
        cohort, n, runtime = self.cohort, len(self.nodes), self.runtime
        targets = None
        if self.parts.model.pad_id is not None:
            keep, targets = keep * sent_entries(dropped, own), sent_targets(y, own)
        smashed = runtime.upload(
            cohort, self.up, t, self.nodes, "smashed_up", {"z": dropped}, entry_mask=keep
        )
        labels = runtime.upload(
            cohort, self.labels, t, self.nodes, "labels_up", {"y": y}, lengths=own, entry_mask=targets
        )
        server_keys = None if keys is None else keys.at(0, SERVER_STAGE)
        batch = CutBatch(None, smashed.payload["z"], y, own, server_keys, cohort=n)
        served = self.server.serve(batch, self.cfg.optimizer.lr, True, list(range(len(own))))
        self.server.step_mean(batch, runtime.aggregation(t, cohort))
        grad_z = served.grad_z
        assert grad_z is not None, "the server returns the cut-layer gradient when asked for it"
        returned = {"g": grad_z * keep.to(grad_z)}
        if self.privacy is not None:  # privacy.cut's gradient_clip: clipped and noised as it goes down
            returned["g"] = self.privacy.returned(t, runtime.first_row(cohort), returned["g"], keep, own)
        grad = runtime.answer(cohort, self.down, t, self.nodes, "grad_down", returned, entry_mask=keep)
        if samples is not None and self.ctx.recorder.recording_cut:
            seen = {"smashed": smashed.payload["z"], "labels": y, "cut_gradients": grad.payload["g"]}
            data = self.ctx.data
            self.ctx.recorder.cut_step(np.arange(n), 0, samples, own, seen, (data.x_train, data.y_train))
        loss = runtime.gather(cohort, {"loss": served.loss})["loss"]
        return ServedCut(grad.payload["g"], loss, smashed.bits + labels.bits, grad.bits)

    def _malicious(self, t: int) -> dict[str, int]:
        """A plain round's adversary figure: how many clients attacked at the cut (none reported without
        an adversary)."""
        if self.adversary is None:
            return {}
        return {"malicious": int(self.adversary.mask(t, np.arange(len(self.nodes))).sum())}

    def _gathered(self, trained: dict[str, Tensors]) -> dict[str, Tensors]:
        """Every client's state from each process's rows of it."""
        return self.averaging.gathered(trained)

    def _aggregate(self, t: int, trained: dict[str, Tensors]) -> tuple[np.ndarray, np.ndarray]:
        """Step 4 (Eq. 14, :class:`~fedge.algorithms.split.fedsl_client.Averaging`): every client then
        holds the mean; returns the upload and broadcast bits per client."""
        reference = self.reference if self.adversary is not None else {}
        self.clients, up_bits, down_bits = self.averaging(t, trained, list(self.clients["masks"]), reference)
        if self.adversary is not None:
            self.reference = {
                k: v[0] for k, v in {**self.clients["params"], **self.clients["buffers"]}.items()
            }
        return up_bits, down_bits

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
        saving = np.zeros_like(sparsities) if self.adapters_only else sparsities  # the module docstring
        client = training_flops(self.flops.trunk, samples) * (1.0 - saving)
        work = SplitWork(clients, up_bits, down_bits, client, training_flops(self.flops.server, samples))
        jitter = None
        if self.cfg.server_order == "arrival":
            jitter = numpy_rng(self.ctx.seed, "arrival-jitter", t, 0).uniform(
                0.0, self.cfg.arrival_jitter_s, len(clients)
            )
        done = light_fedsl_round(system, t, work, model_bits, jitter)
        self.runtime.close(done.cost)
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
        and, with pruning, its mask at one bit per prunable weight. On a LoRA transformer the trunk is the
        adapters; the frozen base each device holds once is metered apart (``frozen_base``)."""
        params, buffers = self.clients["params"], self.clients["buffers"]
        self.models.store(self.nodes, "model", {**params, **floating(buffers)}, stacked=True)
        if self.knobs.final_sparsity > 0:
            mask_bits = sum(m[0].numel() for m in self.clients["masks"].values())
            self.runtime.store(self.nodes, "mask", mask_bits)

    # ----- evaluation and state ----------------------------------------------------------------------

    @property
    def client(self) -> dict[str, Tensors]:
        """The virtual average of the client trunks (uniform, BatchNorm statistics included): the model
        evaluated and reported, which no node receives (the clients' models are averaged through the
        server's pipeline in the round)."""
        n = len(self.nodes)
        uniform = torch.full((n,), 1.0 / n, dtype=torch.float64, device=self.ctx.device)
        return {key: weighted_sum(self.clients[key], uniform) for key in ("params", "buffers")}

    def evaluate(self) -> Evaluation:
        """The virtual average of the client trunks + the server model on the test set, dropout off; also
        that model's sparsity (aggregation lowers it when the clients' masks differ)."""
        data, client = self.ctx.data, self.client
        params = composed(client["params"], self.server.params)
        buffers = composed(client["buffers"], self.server.buffers)
        evaluation = evaluate_model_on(
            self.ctx.cohorts, self.parts.model, params, buffers, data.x_test,
            data.y_test, self.ctx.config.eval.batch_size,
        )  # fmt: skip
        prunable = {name: client["params"][name] for name in self.prunable}
        return evaluation.with_extra(model_sparsity=sparsity(prunable) if prunable else 0.0)


@register(
    "light_fedsl",
    LightFedSLConfig,
    "Lightweight FedSL: client pruning, quantized client gradients, cut dropout, aggregation every I rounds",
)
class LightFedSL(FedSLRounds):
    """Lightweight FedSL: the round with the compression its config sets."""

    cfg: LightFedSLConfig

    def reads_run_length(self) -> str | None:
        return None if self.cfg.schedule_rounds else super().reads_run_length()

    def compression(self) -> Compression:
        cfg = self.cfg
        bits = None if cfg.quant_bits in (None, 32) else cfg.quant_bits
        total = cfg.schedule_rounds or self.ctx.config.rounds
        return Compression(
            cfg.final_sparsity, total, bits, cfg.quant_granularity, cfg.cut_dropout, cfg.agg_interval
        )


@register(
    "fedsl",
    TraditionalFedSLConfig,
    "Traditional FedSL: lightweight FedSL's baseline (no pruning, quantization or dropout; I = 1)",
)
class FedSL(FedSLRounds):
    """Traditional FedSL, lightweight FedSL's one named baseline (its Sec. IV): the same round with every
    compression off, rho_f = 0 (no pruning), q = None (full-precision client gradients), p = 0 (no cut
    dropout) and I = 1 (client aggregation every round)."""

    def compression(self) -> Compression:
        return Compression(0.0, self.ctx.config.rounds, None, "vector", 0.0, 1)
