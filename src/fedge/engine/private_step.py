"""DP-SGD in every local step (``privacy.sample``; Abadi et al., "Deep learning with differential
privacy", 2016, Algorithm 1): each sample's gradient clipped to L2 norm ``C`` over all trained
parameters, the clipped gradients summed, Gaussian noise of std ``z C`` added, and the sum divided by
the batch size ``B`` before the optimizer's update.

Per-sample gradients come from ``torch.func``: ``vmap(grad(loss of one sample))`` over a client's batch;
the batched executor maps that whole function over its clients (a vmap inside a vmap), the sequential
executor calls it for one client at a time. A padding sample (weight 0) has a zero loss, so a zero
gradient: it adds nothing to the sum.

The divisor is the configured batch size ``B`` (the width of the batch plan), not the count of real
samples: a short last batch is then a smaller sum over the same ``B``, and the noise on every step's
gradient has std exactly ``z C / B``. With a clip no gradient reaches and no noise the step equals the
non-private one wherever a batch is full.

Noise is drawn per row and local step from the run's seeded privacy streams, keyed by (round, training
call of the round, client, occurrence of the client in the call, step), or where the caller names the
job, by (job, client, occurrence, step) (an asynchronous dispatch: its key is in the checkpoint): the
sequential and batched executors, any chunking of clients and a resumed run add the same numbers.

A loss with a penalty on the parameters alone (:class:`Penalized`: FedAsync's proximal pull) has only
its data term clipped and noised; the penalty's gradient, which depends on no sample, is added exactly
(as the optimizer's weight decay is).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn
from torch.func import grad_and_value, vmap

from fedge.data.federated import BatchPlan
from fedge.engine.noise import MASK32, keyed_noise, mix32
from fedge.engine.step import LossFn, Optimizer, Step, StepFn
from fedge.errors import ConfigError
from fedge.privacy.release import GAUSSIAN, Release
from fedge.privacy.run import RunPrivacy
from fedge.privacy.sample import GRADIENT
from fedge.rng import derive_seed
from fedge.tensors import Tensors

KEY = "privacy.sample"
_SAMPLE_SALT = 0x27D4EB2F  # tells a sample's dropout key apart from its row's


@dataclass
class SampleMechanism:
    """The run's DP-SGD mechanism: its clip, noise multiplier, releases and noise streams.

    The run's privacy counts the training calls of each round, so two calls in one round (HIST's edge
    rounds, an alternating local update, Ditto's two models) draw different noise; the count is the
    same on either executor.
    """

    privacy: RunPrivacy
    clip: float
    multiplier: float  # z: the configured noise multiplier, else the one privacy.target_epsilon calibrated
    job: tuple[int, ...] | None = None  # the training call's own key (None: the round's call count)

    def open(self, clients: tuple[int, ...], plan: BatchPlan) -> torch.Tensor:
        """Start a training call of ``clients`` by ``plan``: record its releases (in the current round)
        and return the ``[rows, steps]`` noise keys of its rows (int64)."""
        round_ = self.privacy.round
        call: tuple[int | str, ...] = (
            ("job", *self.job) if self.job is not None else (round_, self.privacy.next_call(GRADIENT))
        )
        seen: dict[int, int] = {}
        keys = np.zeros((len(clients), plan.num_steps), dtype=np.int64)
        for r, c in enumerate(clients):
            occurrence = seen[int(c)] = seen.get(int(c), -1) + 1
            for s in range(plan.num_steps):
                keys[r, s] = derive_seed(self.privacy.seed, "sample-dp", *call, int(c), occurrence, s)
        for client, count in most_uses(clients, plan).items():
            self.privacy.record(self.release(round_, client, count))
        return torch.from_numpy(keys)

    def release(self, round_: int, client: int, count: int) -> Release:
        """``count`` sample-level Gaussian releases of ``client``'s noisy gradients in ``round_``."""
        return Release(
            round_, GRADIENT, "sample", GAUSSIAN, self.multiplier, self.clip, count=count, clients=(client,)
        )

    def noise(self, keys: list[int], size: int) -> torch.Tensor:
        """``[rows, size]`` Gaussian noise of std ``z C``, row r from the stream keyed ``keys[r]`` (drawn
        in float32 on the CPU, as every privacy stream is, so every device adds the same numbers)."""
        flat, std = torch.empty(len(keys), size, dtype=torch.float32), self.multiplier * self.clip
        for row, key in zip(flat, keys, strict=True):  # drawn at its std: no second pass to scale it
            row.normal_(0.0, std, generator=self.privacy.generator(GRADIENT, key))
        return flat


def most_uses(clients: tuple[int, ...], plan: BatchPlan) -> dict[int, int]:
    """Per client, the most times any one of its samples is in a batch of ``plan`` (its real entries):
    each use is one release of that sample (the batches of an epoch are disjoint)."""
    index, real = plan.index.cpu().numpy(), (plan.weight > 0).cpu().numpy()
    by_client: dict[int, list[np.ndarray]] = {}
    for r, c in enumerate(clients):
        by_client.setdefault(int(c), []).append(index[r][real[r]])
    out = {}
    for client, parts in by_client.items():
        used = np.concatenate(parts)
        if used.size:
            out[client] = int(np.unique(used, return_counts=True)[1].max())
    return out


def sample_keys(key: torch.Tensor, count: int) -> torch.Tensor:
    """Dropout keys of a batch's ``count`` samples from their row's key (each sample's masks its own)."""
    index = torch.arange(count, dtype=torch.int64, device=key.device)
    return mix32(key ^ mix32((index + 1) * _SAMPLE_SALT & MASK32))


@runtime_checkable
class Penalized(Protocol):
    """A loss that is a data term plus a penalty on the parameters alone (no sample in it)."""

    def data(
        self, params: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, Tensors]:
        """The data term (a :data:`LossFn`)."""
        ...

    def penalty(self, params: Tensors, buffers: Tensors) -> torch.Tensor:
        """The penalty of ``params`` (one value)."""
        ...


@dataclass(frozen=True)
class PrivateStep:
    """A local step of ``loss_fn`` and ``optimizer`` with DP-SGD's gradient (``mechanism``)."""

    loss_fn: LossFn
    optimizer: Optimizer
    mechanism: SampleMechanism

    def for_job(self, job: tuple[int, ...]) -> PrivateStep:
        """This step keying its noise by ``job`` (a dispatch's key) instead of the round's call count."""
        return replace(self, mechanism=replace(self.mechanism, job=job))

    def clipped_sum(
        self,
        params: Tensors,
        buffers: Tensors,
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor,
        key: torch.Tensor | None = None,
    ) -> tuple[Tensors, torch.Tensor]:
        """One client's sum of per-sample gradients, each clipped to ``C``, and its mean loss over the
        real samples (pure: runs under the batched executor's vmap over clients). ``key``: the row's
        dropout key (None: no random layers)."""

        loss_fn = self.loss_fn.data if isinstance(self.loss_fn, Penalized) else self.loss_fn

        def one(p: Tensors, xi: torch.Tensor, yi: torch.Tensor, wi: torch.Tensor, ki: torch.Tensor | None):
            with keyed_noise(ki):
                loss, _ = loss_fn(p, buffers, xi[None], yi[None], wi[None])
            return loss

        keys = None if key is None else sample_keys(key, x.shape[0])
        per_sample = vmap(grad_and_value(one), in_dims=(None, 0, 0, 0, None if keys is None else 0))
        grads, losses = per_sample(params, x, y, weight, keys)
        per_tensor = [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()]
        norms = torch.linalg.vector_norm(torch.stack(per_tensor), dim=0)
        factor = (self.mechanism.clip / norms.clamp_min(torch.finfo(norms.dtype).tiny)).clamp(max=1.0)
        sums = {name: torch.tensordot(factor, g, dims=1) for name, g in grads.items()}
        return sums, (losses * weight).sum() / weight.sum().clamp_min(1.0)

    def noisy_gradients(self, sums: Tensors, keys: list[int], width: int) -> Tensors:
        """Stacked clipped sums (``[rows, ...]``) plus each row's noise, over the batch size ``width``."""
        if self.mechanism.multiplier == 0.0:
            return {name: s / width for name, s in sums.items()}
        some = next(iter(sums.values()))
        sizes = [s[0].numel() for s in sums.values()]
        noise = self.mechanism.noise(keys, sum(sizes)).to(device=some.device, dtype=some.dtype)
        out, offset = {}, 0  # one flat draw per row, split over the tensors in order
        for (name, s), size in zip(sums.items(), sizes, strict=True):
            part = noise[:, offset : offset + size]
            out[name] = torch.add(s.reshape(len(keys), size), part).div_(width).view(s.shape)
            offset += size
        return out

    def __call__(self, params, buffers, opt_state, x, y, weight, lr, keys, width):
        """The pure form of one client's step (its real samples, ``keys``: its privacy and dropout keys
        at this step, ``width``: the batch size): new tensors, the inputs left as they were."""
        params = {name: p.clone() for name, p in params.items()}
        opt_state = {name: s.clone() for name, s in opt_state.items()}
        loss = self.step_(params, buffers, opt_state, x, y, weight, lr, keys, width, False)
        return params, buffers, opt_state, loss

    def step_(
        self,
        params: Tensors,
        buffers: Tensors,
        opt_state: Tensors,
        x: torch.Tensor,
        y: torch.Tensor,
        weight: torch.Tensor,
        lr: float,
        keys: torch.Tensor,
        width: int,
        batched: bool,
    ) -> torch.Tensor:
        """One DP-SGD step in place on stacked rows (``batched``: every row at once under vmap; else one
        row, unstacked, on its real samples). ``keys[r]``: row r's (privacy key, dropout key or -1);
        returns the rows' losses (``[rows]``, or one value)."""
        dropout = keys[..., 1]
        keyed = bool((dropout >= 0).all())
        with torch.no_grad():
            if batched:
                in_dims = (0, 0, 0, 0, 0, 0 if keyed else None)
                fn = vmap(self.clipped_sum, in_dims=in_dims, randomness="different")
                sums, loss = fn(params, buffers, x, y, weight, dropout.to(x.device) if keyed else None)
                privacy_keys = [int(k) for k in keys[:, 0]]
            else:
                sums, loss = self.clipped_sum(
                    params, buffers, x, y, weight, dropout.to(x.device) if keyed else None
                )
                sums = {name: s[None] for name, s in sums.items()}
                privacy_keys = [int(keys[0])]
            grads = self.noisy_gradients(sums, privacy_keys, width)
            if not batched:
                grads = {name: g[0] for name, g in grads.items()}
            if isinstance(self.loss_fn, Penalized):  # the penalty's exact gradient (no sample in it)
                penalty = grad_and_value(self.loss_fn.penalty)
                pulls, value = (vmap(penalty) if batched else penalty)(params, buffers)
                grads = {name: g + pulls[name] for name, g in grads.items()}
                loss = loss + value
            self.optimizer.update_(params, grads, opt_state, lr)
        return loss


def step_keys(
    step: PrivateStep, clients: tuple[int, ...], plan: BatchPlan, dropout: torch.Tensor | None
) -> torch.Tensor:
    """``[rows, steps, 2]``: each row's privacy key and dropout key (-1 without random layers) at every
    step of a training call (which :meth:`SampleMechanism.open` starts)."""
    privacy = step.mechanism.open(clients, plan)
    other = torch.full_like(privacy, -1) if dropout is None else dropout.cpu().to(torch.int64)
    return torch.stack([privacy, other], dim=-1)


def without_privacy(step: StepFn | PrivateStep) -> StepFn:
    """``step`` without DP-SGD: what evaluation fine-tunes with (a fine-tuned copy is only tested, never
    sent, so it releases nothing and spends no budget)."""
    return Step(step.loss_fn, step.optimizer) if isinstance(step, PrivateStep) else step


def private_step(step: Step, privacy: RunPrivacy, model: nn.Module) -> Step | PrivateStep:
    """``step`` with DP-SGD where the run configures ``privacy.sample`` (else ``step`` itself). A model
    with BatchNorm is refused: its batch statistics mix the samples of a batch, so a sample's gradient
    is not its own (GroupNorm and LayerNorm are per sample)."""
    sample = privacy.config.sample
    if sample is None:
        return step
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ConfigError(
            KEY, "needs per-sample gradients, which BatchNorm's batch statistics mix; use GroupNorm"
        )
    multiplier = privacy.multiplier(sample.noise_multiplier, f"{KEY}.noise_multiplier")
    return PrivateStep(step.loss_fn, step.optimizer, SampleMechanism(privacy, sample.clip, multiplier))
