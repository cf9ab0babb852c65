"""How split-learning clients train between exchanges with the server: two shapes of one local step.

- :class:`GradientClients` (SplitFed v1 and v2): the client part runs forward, the smashed data goes to
  the server, the server returns the cut-layer gradient and the client back-propagates it and steps.
- :class:`AuxHeadClients` (FSL_AN, CSE-FSL): the client trains its part and an auxiliary head on a
  local loss (CSE-FSL Eq. 8) and sends the smashed data of the step at upload steps; nothing comes back.

Either step works on the stacked state of a round's participant rows through the run's executor, and
reaches the server through ``exchange``: a function of the smashed data (and whether the gradient is
wanted) that carries out the uploads, the server's steps and any returned gradient, and answers with the
server's :class:`~fedge.algorithms.split.server.Served`.

With ``nopeek`` (NoPeek's alpha, ``algorithm.nopeek``) either step also descends alpha times the distance
correlation of the batch's inputs and the smashed data it sends: SplitFed's clients add its gradient in
the smashed data to the returned cut gradient before back-propagating, aux-head clients add the term to
their local loss.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple

import torch

from fedge.algorithms.split.parts import SplitParts
from fedge.algorithms.split.private_step import (
    NoiseAt,
    make_private_apply,
    make_private_local_step,
    refuse_unsupported,
)
from fedge.algorithms.split.server import Served
from fedge.engine import Executor, Optimizer
from fedge.engine.executors import ClientFn
from fedge.engine.split import make_apply, make_aux_step, make_forward, make_nopeek_gradient, nopeek_penalty
from fedge.errors import ConfigError
from fedge.privacy.cut import clip_rows
from fedge.tensors import Tensors

State = tuple[Tensors, Tensors, Tensors]  # stacked params, buffers, optimizer state of the rows
Exchange = Callable[[torch.Tensor, bool], Served]


def real_rows(counts: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The ``[rows, B]`` 0/1 weights of a step's batch columns (``B``: ``like``'s second dimension),
    1 for each row's first ``counts`` (its real samples), in ``like``'s dtype."""
    width = torch.arange(like.shape[1], device=like.device)
    return (width[None, :] < counts[:, None]).to(like)


def as_state(mapped: tuple[Tensors, ...]) -> State:
    """The rows' state from the state tuple :meth:`Executor.map` returns for a (params, buffers,
    optimizer state) input."""
    params, buffers, opt_state = mapped
    return params, buffers, opt_state


class LocalStep(NamedTuple):
    """The rows' state after one local step and the loss each row trained on (0 for idle rows)."""

    state: State
    loss: torch.Tensor


class ClientSide(ABC):
    """One local step of the participant rows, and which parts of the client model travel."""

    has_aux: bool
    shares_aux: bool
    returns_gradient: bool  # every step exchanges with the server and gets the cut-layer gradient back

    def __init__(
        self,
        parts: SplitParts,
        sgd: Optimizer,
        executor: Executor,
        clip_norm: float | None = None,
        smashed_clip: float | None = None,
        nopeek: float = 0.0,
    ):
        self.parts = parts
        self.sgd = sgd
        self.executor = executor
        self.smashed_clip = smashed_clip  # privacy.cut: each sample's smashed data clipped to this L2 norm
        self.clip_norm = clip_norm
        self.nopeek = nopeek
        self.forward = make_forward(parts.trunk, smashed_clip)
        self.apply = make_apply(sgd, clip_norm)  # the trunk's step on a returned cut-layer gradient
        self.private_apply: ClientFn | None = None  # privacy.sample: that step as DP-SGD
        # NoPeek's gradient in the smashed data, added to a returned cut gradient (None: nopeek off)
        self.nopeek_gradient = make_nopeek_gradient(nopeek) if nopeek > 0 else None

    def privatize(self, clip: float) -> None:
        """Make every parameter update of the client part DP-SGD with per-sample bound ``clip``
        (``privacy.sample``; :mod:`~fedge.algorithms.split.private_step`). NoPeek's term couples the
        batch's samples, so it has no per-sample gradient to clip: the two are not combined."""
        if self.nopeek > 0:
            raise ConfigError("algorithm.nopeek", "a batch-wide loss term, not combined with privacy.sample")
        refuse_unsupported(self.parts.local)
        self.private_apply = make_private_apply(self.forward, self.sgd, self.clip_norm, clip)

    @abstractmethod
    def step(
        self,
        state: State,
        batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        counts: torch.Tensor,
        lr: float,
        keys: torch.Tensor | None,
        exchange: Exchange,
        upload: bool,
        noise: NoiseAt | None = None,
    ) -> LocalStep:
        """Step on ``batch`` = (x, y, 0/1 weight) rows; ``upload`` says whether this step talks to the
        server (SplitFed always does); ``noise`` is the step's DP-SGD noise (``privacy.sample``)."""

    def idle(self, state: State, width: int, exchange: Exchange, upload: bool) -> LocalStep:
        """A step in which none of the rows has a sample while other processes' rows step (a round
        spread over processes): nothing is computed, but the step's exchange still takes place, since
        every process takes part in its collectives, with rows that send nothing (``width``: the batch
        size)."""
        first = next(iter(state[0].values()))
        rows = first.shape[0]
        if upload or self.returns_gradient:
            shape = (rows, width, *self.parts.smashed_shape)
            exchange(torch.zeros(shape, dtype=first.dtype, device=first.device), self.returns_gradient)
        return LocalStep(state, torch.zeros(rows, device=first.device))

    def backprop_step(
        self,
        state: State,
        x: torch.Tensor,
        counts: torch.Tensor,
        lr: float,
        keys: torch.Tensor | None,
        exchange: Exchange,
        noise: NoiseAt | None = None,
    ) -> LocalStep:
        """Forward the trunk, send the smashed data, back-propagate the returned gradient and step.

        ``state`` holds the trunk's entries (and, for aux-head clients, the aux head's, which the
        returned gradient does not reach and which therefore stay as they are). Under
        ``privacy.sample`` the step is DP-SGD with ``noise``.
        """
        params, buffers, opt_state = state
        trunk = {k: v for k, v in params.items() if k.startswith("trunk.")}
        if self.private_apply is not None:
            assert noise is not None, "a DP-SGD step draws its noise"
            return self._private_backprop(state, trunk, x, counts, lr, keys, exchange, noise)
        z, buffers, pullback = self.executor.forward_with_vjp(self.forward, trunk, buffers, x, counts, keys)
        served = exchange(z, True)
        grad_z = served.grad_z
        assert grad_z is not None, "the server returns the cut-layer gradient when asked for it"
        if self.nopeek_gradient is not None:
            grad_z = grad_z + self._nopeek_at_cut(x, z, counts)
        trunk_state = self.sgd.select(opt_state, trunk)
        out = self.executor.map(
            self.apply,
            state=(trunk, trunk_state),
            batch=(),
            shared=(lr,),
            counts=counts,
            inputs=(pullback(grad_z),),
            stage="apply",
        )
        new_params, new_state = out.state
        return LocalStep(({**params, **new_params}, buffers, {**opt_state, **new_state}), served.loss)

    def _nopeek_at_cut(self, x: torch.Tensor, z: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Each row's gradient of NoPeek's term in its smashed data ``z`` (zero past its real rows)."""
        assert self.nopeek_gradient is not None
        out = self.executor.map(
            self.nopeek_gradient,
            state=(),
            batch=(x, z, real_rows(counts, z)),
            shared=(),
            counts=counts,
            stage="nopeek",
        )
        return out.per_sample[0]

    def _private_backprop(
        self,
        state: State,
        trunk: Tensors,
        x: torch.Tensor,
        counts: torch.Tensor,
        lr: float,
        keys: torch.Tensor | None,
        exchange: Exchange,
        noise: NoiseAt,
    ) -> LocalStep:
        """:meth:`backprop_step` as DP-SGD: one forward pass to send, then each sample's trunk gradient
        through its returned cut gradient, clipped, summed, noised and averaged."""
        params, buffers, opt_state = state
        with torch.no_grad():
            out = self.executor.map(
                self.forward, state=(buffers,), batch=(x,), shared=(), counts=counts, inputs=(trunk,),
                keys=keys, stage="forward",
            )  # fmt: skip
        served = exchange(out.per_sample[0], True)
        assert served.grad_z is not None, "the server returns the cut-layer gradient when asked for it"
        assert self.private_apply is not None
        weight = real_rows(counts, served.grad_z)
        trunk_state = self.sgd.select(opt_state, trunk)
        stepped = self.executor.map(
            self.private_apply,
            state=(trunk, trunk_state),
            batch=(x, served.grad_z, weight),
            shared=(lr,),
            counts=counts,
            inputs=(buffers, noise(trunk)),
            keys=keys,
            stage="dp-sgd apply",
        )
        new_params, new_state = stepped.state
        new_buffers = out.state[0]
        return LocalStep(({**params, **new_params}, new_buffers, {**opt_state, **new_state}), served.loss)


class GradientClients(ClientSide):
    """SplitFed: every step sends smashed data and back-propagates the returned cut-layer gradient;
    the gradient's global norm is clipped at ``clip_norm`` when set (FSL_OC)."""

    has_aux = False
    shares_aux = False
    returns_gradient = True

    def __init__(
        self,
        parts: SplitParts,
        sgd: Optimizer,
        executor: Executor,
        clip_norm: float | None,
        smashed_clip: float | None = None,
        nopeek: float = 0.0,
    ):
        super().__init__(parts, sgd, executor, clip_norm, smashed_clip, nopeek)

    def step(self, state, batch, counts, lr, keys, exchange, upload, noise=None) -> LocalStep:
        return self.backprop_step(state, batch[0], counts, lr, keys, exchange, noise)


class AuxHeadClients(ClientSide):
    """Local-loss clients: trunk and aux head step on the aux loss; upload steps send their smashed data.

    The smashed data sent is that of the step's own forward pass (``post_step=False``, the CSE-FSL code's
    choice) or of one more forward pass after the step. ``shares_aux=False`` keeps each client's head at
    home: never sent, never averaged. With ``smashed_clip`` the smashed data is clipped per sample as it
    is sent (the local loss trains on the activations as computed: nothing comes back through the clip).
    """

    has_aux = True
    returns_gradient = False

    def __init__(
        self,
        parts: SplitParts,
        sgd: Optimizer,
        executor: Executor,
        post_step: bool,
        shares_aux: bool,
        smashed_clip: float | None = None,
        nopeek: float = 0.0,
    ):
        super().__init__(parts, sgd, executor, smashed_clip=smashed_clip, nopeek=nopeek)
        penalty = nopeek_penalty(nopeek, smashed_clip) if nopeek > 0 else None
        self.local_step = make_aux_step(parts.local, sgd, post_step, parts.criterion, penalty)
        self.shares_aux, self.post_step = shares_aux, post_step
        self.private_step: ClientFn | None = None

    def privatize(self, clip: float) -> None:
        super().privatize(clip)  # CSE-FSL's server-backprop pass steps on a returned cut gradient
        self.private_step = make_private_local_step(
            self.parts.local, self.sgd, self.parts.criterion, clip, lambda name: True, self.post_step
        )

    def step(self, state, batch, counts, lr, keys, exchange, upload, noise=None) -> LocalStep:
        fn: ClientFn = self.local_step
        inputs: tuple[Tensors, ...] = ()
        if self.private_step is not None:
            assert noise is not None, "a DP-SGD step draws its noise"
            fn, inputs = self.private_step, (noise(state[0]),)
        out = self.executor.map(
            fn,
            state=state,
            batch=batch,
            shared=(lr,),
            counts=counts,
            inputs=inputs,
            keys=keys,
            stage="aux step",
        )
        if upload:
            z = out.per_sample[0]
            exchange(z if self.smashed_clip is None else clip_rows(z, self.smashed_clip, lead=2), False)
        return LocalStep(as_state(out.state), out.per_client[0])
