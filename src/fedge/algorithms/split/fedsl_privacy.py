"""Privacy in lightweight FedSL and FedSL (``privacy.cut``, ``privacy.labels``, ``privacy.sample``): the
split family's mechanisms (:class:`~fedge.algorithms.split.privacy.CutPrivacy`,
:class:`~fedge.algorithms.split.private_step.SampleDP`) placed in a round of one step, with its
compression around them.

Each client's step, in order:

1. **Smashed data.** The trunk's output, then the cut dropout (inverted, the mask from the seed-shared
   stream: it does not depend on the data), then each sample's dropped activation clipped to L2 norm
   ``C`` and Gaussian noise of std ``z C`` added to its kept entries. The clipped tensor is the one that
   crosses the link, so its kept entries have sensitivity ``C`` whatever the dropout rate (a clip
   before the dropout would leave ``C / (1 - p)``); the dropped entries are zero and are not sent. The
   client's backward pass goes through the clip and the dropout as computed.
2. **Labels.** One randomized response per sample for the whole run; the server's loss uses it.
3. **Cut gradient** (``gradient_clip``). The server's gradient of the kept entries, each sample's clipped
   and noised on its kept entries before it goes down. Quantizing it on the link (``codec_down:
   q<bits>``) is post-processing of that release.
4. **DP-SGD** (``privacy.sample``). Each sample's gradient of the client's parameters through its
   returned cut gradient (back through clip and dropout), on the weights its current mask keeps (a
   pruned weight is zero and stays zero: its gradient is dropped before the clip), clipped to ``C`` over
   them, summed, noise of std ``z C`` on the same weights, divided by the batch's sample count. The
   mask is post-processing of the client's earlier releases (the weights of past private steps and the
   average of such weights), and where the client prunes in this step its importance ``|w * g|`` reads
   this step's noisy gradient, so pruning keeps the guarantee; the pruned weights carry no signal, so
   they need no noise. The q-bit stochastic quantization of that gradient (seeded draws), the SGD step
   and the averaging every ``I`` rounds are post-processing too.

Releases. A round is one step of every client and its epoch spans rounds, each sample in one batch of
it: a client's epoch releases each sample once at the cut (and once more as a cut gradient, and once
in a DP-SGD step), recorded at the epoch's first round (:func:`fedge.privacy.cut.begins_pass`), as the
planners count. Noise is keyed by (round, client, 0, 0, step 0), so both executors and any split of the
clients over processes add the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.func import vjp

from fedge.algorithms.base import Context
from fedge.algorithms.split.parts import SplitParts
from fedge.algorithms.split.privacy import CutPrivacy
from fedge.algorithms.split.private_step import (
    SampleDP,
    cut_sample_gradients,
    noisy_clipped_mean,
    refuse_unsupported,
)
from fedge.engine import Executor
from fedge.engine.executors import ClientFn, Mapped
from fedge.engine.split import ClientForward
from fedge.privacy.cut import clip_rows
from fedge.tensors import Tensors

Pullback = Callable[[torch.Tensor], torch.Tensor]


def make_masked_private_gradient(forward: ClientForward, clip: float) -> ClientFn:
    """DP-SGD's gradient of a client's parameters on a returned cut gradient, the per-sample gradients
    restricted to the weights ``keeps`` holds (1: kept, 0: pruned): ``fn(zero, params, buffers, noise,
    keeps, x, grad_z, weight) -> Mapped((gradient,))`` (``zero``: the state an idle row keeps)."""
    per_sample = cut_sample_gradients(forward)

    def gradient(zero, params, buffers, noise, keeps, x, grad_z, weight):
        grads = per_sample(params, buffers, x, grad_z, weight)
        masked = {name: g * keeps[name] if name in keeps else g for name, g in grads.items()}
        return Mapped((noisy_clipped_mean(masked, weight, noise, clip),))

    return gradient


class FedSLPrivacy:
    """A lightweight FedSL (or FedSL) run's mechanisms; rows are clients ``first, first + 1, ...``."""

    def __init__(self, ctx: Context, parts: SplitParts, forward: ClientForward):
        self.cut = CutPrivacy.of(ctx)
        self.sample = SampleDP.of(ctx)
        self.sent_labels = ctx.data.y_train if self.cut is None else self.cut.sent_labels
        self.gradients: ClientFn | None = None
        if self.sample is not None:
            refuse_unsupported(parts.local)
            self.gradients = make_masked_private_gradient(forward, self.sample.clip)

    @classmethod
    def of(cls, ctx: Context, parts: SplitParts, forward: ClientForward) -> FedSLPrivacy | None:
        """The run's mechanisms, or None when none is configured."""
        config = ctx.config.privacy
        if config.cut is None and config.labels is None and config.sample is None:
            return None
        return cls(ctx, parts, forward)

    def record(self, t: int, opened: np.ndarray) -> None:
        """Round ``t``'s releases: ``opened`` (``[K, ...]``, -1 padded) are the samples of the epoch each
        client opens this round, each sent, returned and stepped on once in the epoch."""
        clients = np.arange(len(opened))
        if self.cut is not None:
            self.cut.begin(t, clients)
            self.cut.record(t, clients, opened, opened)
        if self.sample is not None:
            self.sample.begin(t, clients)
            self.sample.record(t, clients, opened, opened)

    def released(
        self, t: int, first: int, dropped: torch.Tensor, keep: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, Pullback | None]:
        """The smashed data the rows send (``dropped``: dropout applied) and the pullback through its clip
        (None: sent as computed)."""
        if self.cut is None or self.cut.cut is None:
            return dropped, None
        clip = self.cut.cut.clip
        through = vjp(lambda d: clip_rows(d, clip, lead=2), dropped)
        clipped, pullback = through[0], through[1]
        clients, draws = _rows(first, counts)
        noisy = self.cut.smashed(t, clients, draws, 0, clipped, counts)
        return torch.where(keep > 0, noisy, clipped), lambda g: pullback(g)[0]

    def returned(
        self, t: int, first: int, grad: torch.Tensor, keep: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """The rows' cut gradient of the kept entries (``grad``, zero elsewhere) as it goes down: clipped
        and noised per sample with ``gradient_clip``, else as computed."""
        if self.cut is None:
            return grad
        clients, draws = _rows(first, counts)
        return torch.where(keep > 0, self.cut.gradient(t, clients, draws, 0, grad, counts), grad)

    def gradient(
        self,
        executor: Executor,
        t: int,
        first: int,
        state: tuple[Tensors, Tensors, Tensors],
        x: torch.Tensor,
        grad_z: torch.Tensor,
        counts: torch.Tensor,
    ) -> Tensors:
        """The rows' DP-SGD gradients (``state``: their parameters, buffers and masks) on the returned cut
        gradient ``grad_z`` (of the trunk's output)."""
        assert self.sample is not None and self.gradients is not None
        params, buffers, masks = state
        keeps = {name: mask.to(params[name]) for name, mask in masks.items()}
        clients, draws = _rows(first, counts)
        noise = self.sample.at(t, clients, draws, 0, counts)(params)
        noise = {name: n * keeps[name] if name in keeps else n for name, n in noise.items()}
        weight = (torch.arange(x.shape[1], device=x.device)[None, :] < counts[:, None]).to(grad_z)
        out = executor.map(
            self.gradients,
            state=({name: torch.zeros_like(p) for name, p in params.items()},),
            batch=(x, grad_z, weight),
            shared=(),
            counts=counts,
            inputs=(params, buffers, noise, keeps),
            stage="dp-sgd gradient",
        )
        return out.state[0]

    def state_dict(self) -> dict[str, Any]:
        """The clients whose labels went out already (a resumed run records their release no more)."""
        return {} if self.cut is None else self.cut.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.cut is not None:
            self.cut.load_state_dict(state)


def _rows(first: int, counts: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The clients of rows ``first, first + 1, ...`` and their draw in the round (each is drawn once)."""
    rows = len(counts)
    return np.arange(first, first + rows), np.zeros(rows, dtype=np.int64)
