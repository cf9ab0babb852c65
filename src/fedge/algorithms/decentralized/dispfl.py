"""Dis-PFL (Dai et al. 2022): decentralized sparse training with personal masks (AFIND+ Fig. 5).

Every client holds a personal binary mask over the weight matrices / kernels (ERK initialisation at
``density``; biases and other 1-d tensors stay dense) and trains only its masked model. Each round:
local training of the masked model; mask evolution (prune the fraction ``alpha_t`` of the smallest
active weights, ``alpha_t`` cosine-annealed from ``anneal`` to 0 over the run, and regrow as many
inactive ones, excluding those just pruned, where the dense gradient on the probe batch is largest;
regrown weights start at 0); then each client averages every coordinate over the peers (and itself)
whose mask holds it, and re-applies its own mask. Peers are random or chosen by AFIND+. A sent model is
its active values (fp32) plus the mask as a bitmap.

Privacy: ``privacy.peer`` noises the sent values like every peer's model; the mask that travels with
them is evolved from the client's own weights and gradients (with ``anneal > 0``) and sent as is, so a
run with a peer mechanism records it as a non-private release (``peer_mask``).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch.func import functional_call, grad, vmap

from fedge.algorithms.base import Context, register
from fedge.algorithms.decentralized.common import PeerAlgorithm
from fedge.algorithms.decentralized.config import PeerConfig
from fedge.algorithms.decentralized.hosted import HostedConfig, PeerChoice
from fedge.algorithms.decentralized.probes import ProbeBatches
from fedge.engine import make_step, weighted_mean
from fedge.engine.private_step import private_step
from fedge.errors import ConfigError
from fedge.metrics import Evaluation, RoundReport
from fedge.privacy.peer import unprotected
from fedge.rng import torch_rng
from fedge.tensors import Tensors

MASK = "mask::"


class DisPFLConfig(PeerConfig, HostedConfig):
    """Mask density (ERK), the initial prune fraction, plus the host fields (peer choice, AFIND+ knobs)."""

    name: Literal["dispfl"] = "dispfl"
    """the algorithm (`fedge list`)"""
    density: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    """share of weights each client's sparse model keeps (ERK)"""
    anneal: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.5
    """initial share of the kept weights pruned and regrown, annealed to 0"""


def erk_densities(shapes: dict[str, tuple[int, ...]], density: float) -> dict[str, float]:
    """Erdős–Rényi-kernel densities: layer l gets ``eps * sum(shape) / prod(shape)`` (at most 1), with
    ``eps`` chosen so the masked layers hold ``density`` of their weights overall."""
    sizes = {k: math.prod(s) for k, s in shapes.items()}
    raw = {k: sum(s) / sizes[k] for k, s in shapes.items()}
    dense: set[str] = set()
    while True:
        budget = density * sum(sizes.values()) - sum(sizes[k] for k in dense)
        rest = sum(raw[k] * sizes[k] for k in shapes if k not in dense)
        eps = budget / rest if rest > 0 else 0.0
        over = {k for k in shapes if k not in dense and eps * raw[k] > 1.0}
        if not over:
            return {k: 1.0 if k in dense else eps * raw[k] for k in shapes}
        dense |= over


@register(
    "dispfl", DisPFLConfig, "Dis-PFL: personal sparse masks, masked averaging with peers (random/AFIND+)"
)
class DisPFL(PeerAlgorithm):
    """Sparse personal models: the bank holds masked weights, ``self.masks`` the 0/1 masks per client."""

    takes_loss = False  # its own loss terms are cross-entropy

    cfg: DisPFLConfig
    state_fields = (*PeerAlgorithm.state_fields, "masks", "choice")

    def __init__(self, ctx: Context, cfg: DisPFLConfig):
        super().__init__(ctx, cfg)
        if cfg.codec_model != "fp32":
            raise ConfigError(
                "algorithm.codec_model", "Dis-PFL sends its masked models as bitmaps (no codec)"
            )
        self.choice = PeerChoice(self.view(), cfg.peer_selection, cfg.afind, cfg.peers)
        self.step = private_step(make_step(self._masked_loss, self.sgd), ctx.privacy, self.model)
        shapes = {k: tuple(v.shape[1:]) for k, v in self.bank.params.items() if v.dim() > 2}
        self.densities = erk_densities(shapes, cfg.density)
        self.masks = {k: self._initial_mask(k, shapes[k]) for k in shapes}
        self.bank.adopt(self._apply(self.bank.params), owned=False)
        self.models = ctx.network.link("bitmap")

    def _initial_mask(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        size = math.prod(shape)
        active = self._active(name, size)
        rows = []
        for c in range(self.num_clients):
            order = torch.randperm(size, generator=torch_rng(self.ctx.seed, "dispfl-mask", name, c))
            row = torch.zeros(size, dtype=torch.bool)
            row[order[:active]] = True
            rows.append(row.reshape(shape))
        return torch.stack(rows).to(self.ctx.device)

    def _apply(self, params: Tensors) -> Tensors:
        return {k: v * self.masks[k] if k in self.masks else v for k, v in params.items()}

    def model_nonzeros(self) -> dict[str, int]:
        """A sparse model's kept values: a masked tensor travels as a bitmap plus its mask's entries, the
        others dense. The ERK density gives every client the same count per layer, which pruning and
        regrowing keep."""
        return {k: self._active(k, math.prod(mask.shape[1:])) for k, mask in self.masks.items()}

    def _active(self, name: str, size: int) -> int:
        """How many of the ``size`` weights of tensor ``name`` every client's mask keeps (ERK)."""
        return round(self.densities[name] * size)

    def _extra(self) -> Tensors:
        return {MASK + k: m.float() for k, m in self.masks.items()}

    def _masked_loss(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ):
        """Cross-entropy of the masked model (masks ride in the buffers, so gradients are masked)."""
        state = {k: v.clone() for k, v in buffers.items() if not k.startswith(MASK)}
        masks = {k: v for k, v in buffers.items() if k.startswith(MASK)}
        effective = {k: p * masks[MASK + k] if MASK + k in masks else p for k, p in params.items()}
        logits = functional_call(self.model, {**effective, **state}, (x,))
        loss = weighted_mean(F.cross_entropy(logits, y, reduction="none"), w)
        return loss, {**state, **masks}

    def _dense_grads(self, params: Tensors, buffers: Tensors, batches: ProbeBatches, rows: slice) -> Tensors:
        """Gradient of each client ``rows``'s loss on its probe batch w.r.t. its (masked) weights, dense (a
        forward and backward pass by every client on its own probe batch)."""

        def one(p: Tensors, b: Tensors, ix: torch.Tensor, w: torch.Tensor) -> Tensors:
            def loss(q: Tensors) -> torch.Tensor:
                logits = functional_call(self.model, {**p, **q, **b}, (self.ctx.data.x_train[ix],))
                per = F.cross_entropy(logits, self.ctx.data.y_train[ix], reduction="none")
                return weighted_mean(per, w)

            return grad(loss)({k: p[k] for k in self.masks})

        clients = torch.arange(self.num_clients, device=self.ctx.device)[rows]
        self.count_probes(clients, batches, backward=True)
        self.model.eval()
        try:
            return vmap(one)(
                {k: v[rows] for k, v in params.items()},
                {k: v[rows] for k, v in buffers.items()},
                batches.index[rows],
                batches.weight[rows],
            )
        finally:
            self.model.train()

    def reads_run_length(self) -> str | None:
        return "dispfl anneals its mask updates by a cosine over the run's rounds"

    def _evolve(self, t: int, params: Tensors, buffers: Tensors, batches: ProbeBatches) -> float:
        """Prune the ``alpha_t`` smallest active weights per layer and regrow as many by gradient;
        returns ``alpha_t``. Every client's masks evolve on their own, so the clients are a cohort: each
        process evolves its rows and the masks come back in client order (as 0/1 bytes)."""
        alpha = 0.5 * self.cfg.anneal * (1.0 + math.cos(math.pi * t / self.ctx.config.rounds))

        def process_rows(rows: slice) -> Tensors:
            if rows.stop == rows.start:  # fewer clients than processes: nothing to evolve here
                return {k: m[rows].to(torch.uint8) for k, m in self.masks.items()}
            masks = self._evolved(alpha, params, buffers, batches, rows)
            return {k: m.to(torch.uint8) for k, m in masks.items()}

        self.masks = {k: m.bool() for k, m in self.map_rows(self.num_clients, process_rows).items()}
        return alpha

    def _evolved(
        self, alpha: float, params: Tensors, buffers: Tensors, batches: ProbeBatches, rows: slice
    ) -> Tensors:
        """The masks of clients ``rows`` after pruning and regrowing a fraction ``alpha`` of them."""
        grads = self._dense_grads(params, buffers, batches, rows)
        out = {}
        for name, full in self.masks.items():
            mask = full[rows]
            flat = mask.reshape(len(mask), -1)
            active = int(flat[0].sum())
            count = min(int(alpha * active), flat.shape[1] - active)
            if count <= 0:
                out[name] = mask
                continue
            weight = params[name][rows].reshape(len(mask), -1).abs()
            pruned = torch.topk(
                torch.where(flat, weight, torch.full_like(weight, math.inf)), count, largest=False
            )
            new = flat.clone()
            new.scatter_(1, pruned.indices, False)
            score = grads[name].reshape(len(mask), -1).abs()
            grown = torch.topk(torch.where(flat, torch.full_like(score, -math.inf), score), count)
            new.scatter_(1, grown.indices, True)
            out[name] = new.reshape(mask.shape)
        return out

    def peer_round(self, t: int) -> RoundReport:
        own = torch.arange(self.num_clients, device=self.ctx.device)
        batches = self.probes(t)
        plan = self.choice.begin(t, batches)
        start_p, start_b = self.rows(own)
        params, buffers, losses = self.local_update(start_p, start_b, own.tolist(), t, extra=self._extra())
        params = self._apply(params)
        alpha = self._evolve(t, params, buffers, batches)
        params = self._apply(params)
        weights = self.choice.weights(plan, params, buffers, batches)
        shared = self.shared({**params, **buffers})
        masks = {k: m for k, m in self.masks.items() if k in shared}
        mixed_p, mixed_b = self.mixed(weights, params, buffers, masks=masks)
        self.bank.adopt(self._apply(mixed_p), mixed_b, owned=False)
        metrics = self.choice.end(t, plan)
        if self.accounted and self.cfg.anneal > 0:  # an evolved mask is drawn from the client's data
            senders = torch.nonzero(self.choice.drawn())[:, 1].tolist()
            for release in unprotected(t, "peer_mask", senders):
                self.ctx.privacy.record(release)
        return RoundReport(float(losses.double().mean()), {"alpha": alpha, **metrics})

    def evaluate(self) -> Evaluation:
        return self.evaluate_bank(self.bank, extra=self._extra())
