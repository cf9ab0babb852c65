"""DP-SGD in split learning's client step (``privacy.sample``; Abadi et al., "Deep learning with
differential privacy", 2016, Algorithm 1).

A split client's parameter update becomes a Gaussian mechanism on its batch: each sample's gradient of
the client-side parameters is computed on its own, clipped to L2 norm ``C`` over every trained tensor,
the clipped gradients are summed, Gaussian noise of std ``z * C`` is added and the sum is divided by the
batch's sample count (a fixed public number, so the division is post-processing). Which gradient that is
depends on the algorithm:

- SplitFed v1 / v2 (and CSE-FSL's server-backprop pass): the trunk's gradient through the cut gradient
  the server returns. The server returns ``dL/dz`` of its batch's mean loss, so sample ``i``'s own
  gradient is the vector-Jacobian product of its smashed data with ``n * dL/dz_i``.
- FSL_AN, CSE-FSL: the gradient of the sample's auxiliary loss in trunk and auxiliary head together.
- FSL-SAGE: the gradient of the sample's auxiliary loss in the trunk alone (the aux model is held fixed).

Per-sample gradients come from ``torch.func``: ``vmap`` over the batch's samples of ``grad`` of one
sample's loss, so under the batched executor (itself a ``vmap`` over clients) the clients are batched
too. Noise cannot be drawn inside a ``vmap``; it is drawn before the step from the run's keyed streams
(round, client, draw of the client, its run in the round, step) and passed in, so both executors add the
same numbers. Per-sample gradients need samples that do not see each other: a client part with
BatchNorm is refused, and so is one with dropout (keyed masks inside the per-sample ``vmap`` would be
one mask for the whole batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import grad, grad_and_value, vmap

from fedge.algorithms.base import Context
from fedge.config import SampleDPConfig
from fedge.engine.bind import call_at
from fedge.engine.executors import ClientFn, Mapped
from fedge.engine.noise import has_random_layers
from fedge.engine.split import ClientForward, clip_global_norm, prefixed
from fedge.engine.step import Criterion, Optimizer, weighted_mean
from fedge.errors import ConfigError
from fedge.privacy.cut import most_sends
from fedge.privacy.release import GAUSSIAN, Release
from fedge.privacy.run import RunPrivacy
from fedge.tensors import Tensors

GRADIENT = "gradient"
SMASHED = "smashed"
NoiseAt = Callable[[Tensors], Tensors]
"""The stacked trained parameters of a step's rows -> the step's noise for each, shaped alike."""


def refuse_unsupported(module: nn.Module) -> None:
    """Refuse a client part whose samples see each other (BatchNorm: no per-sample gradient) or that
    draws dropout masks (inside the per-sample ``vmap`` every sample would get the same mask)."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        raise ConfigError("privacy.sample", "per-sample gradients need a client part without BatchNorm")
    if has_random_layers(module):
        raise ConfigError("privacy.sample", "per-sample gradients need a client part without dropout")


def noisy_clipped_mean(grads: Tensors, weight: torch.Tensor, noise: Tensors, clip: float) -> Tensors:
    """DP-SGD's gradient from per-sample ``grads`` (``[B, ...]`` each): every real sample (``weight`` 1)
    scaled to joint L2 norm at most ``clip``, summed, ``noise`` added, divided by the sample count."""
    squares = [g.flatten(1).square().sum(dim=1) for g in grads.values()]
    norms = torch.stack(squares).sum(dim=0).sqrt()
    tiny = torch.finfo(norms.dtype).tiny
    factor = (clip / norms.clamp_min(tiny)).clamp(max=1.0) * weight
    count = weight.sum().clamp_min(1.0)
    return {
        name: (torch.tensordot(factor.to(g), g, dims=1) + noise[name]) / count for name, g in grads.items()
    }


CutSampleGradients = Callable[[Tensors, Tensors, torch.Tensor, torch.Tensor, torch.Tensor], Tensors]
"""``(params, buffers, x, grad_z, weight)`` -> each sample's gradient of the client-side parameters."""


def cut_sample_gradients(forward: ClientForward) -> CutSampleGradients:
    """Each sample's gradient of the client-side parameters through the cut gradient ``grad_z`` the server
    returns for its batch's mean loss: sample ``i``'s is ``d <z_i, n * grad_z_i> / d params``, its smashed
    data computed on its own (through ``forward``'s clip when set), ``n`` the batch's sample count."""

    def sample_output(params: Tensors, buffers: Tensors, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        z = forward(buffers, params, x[None]).per_sample[0][0]
        return (z * g).sum()

    per_sample = vmap(grad(sample_output), in_dims=(None, None, 0, 0))

    def gradients(
        params: Tensors, buffers: Tensors, x: torch.Tensor, grad_z: torch.Tensor, weight: torch.Tensor
    ):
        scale = weight.sum().reshape(*([1] * grad_z.dim()))
        return per_sample(params, buffers, x, grad_z * scale)

    return gradients


def make_private_apply(
    forward: ClientForward, sgd: Optimizer, clip_norm: float | None, clip: float
) -> ClientFn:
    """SplitFed's trunk update on a returned cut gradient as DP-SGD: ``fn(params, opt_state, buffers,
    noise, x, grad_z, weight, lr)`` on :func:`cut_sample_gradients`."""
    per_sample = cut_sample_gradients(forward)

    def apply(params, opt_state, buffers, noise, x, grad_z, weight, lr):
        grads = per_sample(params, buffers, x, grad_z, weight)
        private = noisy_clipped_mean(grads, weight, noise, clip)
        new_params, new_state = sgd.update(params, clip_global_norm(private, clip_norm), opt_state, lr)
        return Mapped((new_params, new_state))

    return apply


def _aux_sample_loss(local: nn.Module, criterion: Criterion) -> Callable[..., Any]:
    """One sample's auxiliary loss ``(trained, fixed, buffers, x, y) -> (loss, z)`` (trunk then aux
    head; ``trained`` and ``fixed`` together hold both parts' prefixed parameters)."""
    trunk, aux = local.get_submodule("trunk"), local.get_submodule("aux")

    def loss(trained: Tensors, fixed: Tensors, buffers: Tensors, x: torch.Tensor, y: torch.Tensor):
        params = {**fixed, **trained}
        z = call_at(trunk, {**prefixed(params, "trunk."), **prefixed(buffers, "trunk.")}, (x[None],))
        logits = call_at(aux, {**prefixed(params, "aux."), **prefixed(buffers, "aux.")}, (z,))
        return criterion(logits, y[None])[0], z[0]

    return loss


def make_private_local_step(
    local: nn.Module,
    sgd: Optimizer,
    criterion: Criterion,
    clip: float,
    trains: Callable[[str], bool],
    post_step: bool = False,
) -> ClientFn:
    """A local-loss step (FSL_AN, CSE-FSL: ``trains`` every parameter; FSL-SAGE: the trunk's only) as
    DP-SGD: ``fn(params, buffers, opt_state, noise, x, y, weight, lr)`` -> the new state, the batch's mean
    loss and its smashed data (of this step's forward pass, or with ``post_step`` of the updated trunk's)."""
    per_sample = vmap(
        grad_and_value(_aux_sample_loss(local, criterion), has_aux=True), in_dims=(None, None, None, 0, 0)
    )
    trunk = local.get_submodule("trunk")

    def step(params, buffers, opt_state, noise, x, y, weight, lr):
        trained = {k: v for k, v in params.items() if trains(k)}
        fixed = {k: v for k, v in params.items() if not trains(k)}
        grads, (losses, z) = per_sample(trained, fixed, buffers, x, y)
        private = noisy_clipped_mean(grads, weight, noise, clip)
        new_trained, new_state = sgd.update(trained, private, sgd.select(opt_state, trained), lr)
        new_params = {**params, **new_trained}
        if post_step:
            z = call_at(trunk, {**prefixed(new_params, "trunk."), **prefixed(buffers, "trunk.")}, (x,))
        value = weighted_mean(losses, weight)
        return Mapped((new_params, buffers, {**opt_state, **new_state}), (value.detach(),), (z.detach(),))

    return step


class SampleDP:
    """A split run's DP-SGD (``privacy.sample``): the clip, the noise multiplier, keyed noise for each
    step and the releases of each round."""

    def __init__(self, ctx: Context, config: SampleDPConfig):
        self.privacy: RunPrivacy = ctx.privacy
        self.config = config
        self.cut_in_clear = ctx.config.privacy.cut is None  # smashed data then leaves without noise
        self.runs: dict[tuple[int, int], int] = {}  # (round, client) -> local runs begun in the round

    @classmethod
    def of(cls, ctx: Context) -> SampleDP | None:
        """The run's DP-SGD, or None without ``privacy.sample``."""
        config = ctx.config.privacy.sample
        return None if config is None else cls(ctx, config)

    @property
    def clip(self) -> float:
        return self.config.clip

    def noise_multiplier(self) -> float:
        """The configured multiplier, or the one calibrated to ``privacy.target_epsilon``."""
        return self.privacy.multiplier(self.config.noise_multiplier, "privacy.sample.noise_multiplier")

    def begin(self, t: int, clients: np.ndarray) -> None:
        """A local run of ``clients`` begins in round ``t`` (a second run in one round draws other noise)."""
        self.runs = {key: n for key, n in self.runs.items() if key[0] == t}
        for c in np.unique(clients).tolist():
            self.runs[t, c] = self.runs.get((t, c), -1) + 1

    def at(
        self, t: int, clients: np.ndarray, occurrence: np.ndarray, step: int, counts: torch.Tensor
    ) -> NoiseAt:
        """The noise of step ``step`` for rows of ``clients`` (``counts`` samples each; none: no noise)."""

        def noise(like: Tensors) -> Tensors:
            out = {name: torch.zeros_like(t) for name, t in like.items()}
            std = self.noise_multiplier() * self.clip
            if std == 0.0:
                return out
            names = sorted(like)
            sizes = [like[name][0].numel() for name in names]
            flat = torch.empty(sum(sizes), dtype=like[names[0]].dtype, device=like[names[0]].device)
            for r, (c, k, n) in enumerate(
                zip(clients.tolist(), occurrence.tolist(), counts.tolist(), strict=True)
            ):
                if not n:
                    continue
                key = (t, int(c), int(k), self.runs.get((t, int(c)), 0), step)
                draws = self.privacy.gaussian(flat, std, GRADIENT, *key).split(sizes)
                for name, draw in zip(names, draws, strict=True):
                    out[name][r] = draw.reshape(like[name].shape[1:])
            return out

        return noise

    def record(self, t: int, clients: np.ndarray, used: np.ndarray, smashed: np.ndarray) -> None:
        """Round ``t``'s releases: per client one DP-SGD release whose count is the most times one of its
        samples was in a step (``used``: ``[rows, ...]`` sample indices, -1 padded; once per epoch, the
        epoch's batches being disjoint), and, when ``privacy.cut`` is off, the ``smashed`` data sent in
        clear as a release without noise (its epsilon is infinite)."""
        z, clip = self.noise_multiplier(), self.clip
        for client, count in most_sends(clients, used).items():
            self.privacy.record(
                Release(t, GRADIENT, "sample", GAUSSIAN, z, clip, count=count, clients=(client,))
            )
        if self.cut_in_clear:
            for client, count in most_sends(clients, smashed).items():
                self.privacy.record(
                    Release(t, SMASHED, "sample", GAUSSIAN, 0.0, count=count, clients=(client,))
                )
