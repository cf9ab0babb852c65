"""Clients that train on an estimated cut-layer gradient (FSL-SAGE): the client's own auxiliary model stands
in for the server, and only the trunk learns from it.

At each local step the trunk maps the batch to smashed data ``z``, the aux model maps ``z`` to logits, and
the gradient of the aux model's loss with respect to ``z`` is the client's estimate of what the server
would have returned (the FSL-SAGE paper's estimated smashed-activation gradient). Back-propagating it
through the trunk is the gradient of the aux loss in the trunk's weights, so one autograd pass of that
loss over the trunk alone takes the step; the aux model is a constant of the step (the server aligns it,
:mod:`~fedge.algorithms.split.alignment`). The smashed data of the step's forward pass is what an upload
step sends. Where the server aligns a client's aux model on that upload (``alignment_timing:
first_batch``, the public code's), the step is taken again from its start with the aligned aux model:
its smashed data, a function of the trunk alone, is the one sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.func import grad_and_value

from fedge.algorithms.split.clients import ClientSide, LocalStep, State, as_state
from fedge.algorithms.split.parts import SplitParts
from fedge.algorithms.split.private_step import make_private_local_step
from fedge.engine import Executor, Optimizer
from fedge.engine.bind import call_at
from fedge.engine.executors import ClientFn, Mapped, TwoForms
from fedge.engine.split import eager_grad_and_value, prefixed, weighted_loss
from fedge.engine.step import Criterion
from fedge.privacy.cut import clip_rows
from fedge.tensors import Tensors


def make_estimated_step(local: nn.Module, sgd: Optimizer, criterion: Criterion) -> ClientFn:
    """One local step of the trunk (state names ``trunk.*``) on the aux model's (``aux.*``) loss, the aux
    model held fixed; returns the new state, the loss and the step's smashed data."""
    trunk, aux = local.get_submodule("trunk"), local.get_submodule("aux")

    def loss(trunk_params: Tensors, aux_params: Tensors, buffers: Tensors, x, y, weight):
        new_buffers = {name: t.clone() for name, t in buffers.items()}
        z = call_at(trunk, {**prefixed(trunk_params, "trunk."), **prefixed(new_buffers, "trunk.")}, (x,))
        logits = call_at(aux, {**prefixed(aux_params, "aux."), **prefixed(new_buffers, "aux.")}, (z,))
        return weighted_loss(logits, y, weight, criterion), (new_buffers, z)

    def stepping(loss_and_grad: Callable[..., Any]) -> ClientFn:
        def step(params, buffers, opt_state, x, y, weight, lr):
            trunk_params = {k: v for k, v in params.items() if k.startswith("trunk.")}
            aux_params = {k: v for k, v in params.items() if k.startswith("aux.")}
            grads, (value, (new_buffers, z)) = loss_and_grad(trunk_params, aux_params, buffers, x, y, weight)
            new_trunk, new_state = sgd.update(trunk_params, grads, sgd.select(opt_state, trunk_params), lr)
            state = ({**params, **new_trunk}, new_buffers, {**opt_state, **new_state})
            return Mapped(state, (value.detach(),), (z.detach(),))

        return step

    return TwoForms(stepping(grad_and_value(loss, has_aux=True)), stepping(eager_grad_and_value(loss)))


def _in_trunk(name: str) -> bool:
    return name.startswith("trunk.")


class EstimatedGradientClients(ClientSide):
    """FSL-SAGE's clients: the trunk steps on its own aux model's estimate of the server's gradient; upload
    steps send the step's smashed data; nothing comes back during the local steps. Each client keeps its
    own aux model (never averaged: the server aligns each one to its client's data)."""

    has_aux = True
    shares_aux = False
    returns_gradient = False

    def __init__(
        self,
        parts: SplitParts,
        sgd: Optimizer,
        executor: Executor,
        realigned: Callable[[State], State | None] | None = None,
        smashed_clip: float | None = None,
    ):
        super().__init__(parts, sgd, executor, smashed_clip=smashed_clip)
        self.local_step = make_estimated_step(parts.local, sgd, parts.criterion)
        self.realigned = realigned
        """after an upload: the rows' state with the aux models the server aligned on it, or None"""
        self.private_step: ClientFn | None = None

    def privatize(self, clip: float) -> None:
        super().privatize(clip)
        self.private_step = make_private_local_step(
            self.parts.local, self.sgd, self.parts.criterion, clip, _in_trunk
        )  # the aux model is held fixed

    def step(self, state, batch, counts, lr, keys, exchange, upload, noise=None) -> LocalStep:
        drawn = None  # privacy.sample: the step's noise (a realigned retake adds the same)
        if self.private_step is not None:
            assert noise is not None, "a DP-SGD step draws its noise"
            drawn = noise({k: v for k, v in state[0].items() if k.startswith("trunk.")})
        out = self._mapped(state, batch, counts, lr, keys, drawn)
        if upload:
            z = out.per_sample[0]
            exchange(z if self.smashed_clip is None else clip_rows(z, self.smashed_clip, lead=2), False)
            aligned = None if self.realigned is None else self.realigned(state)
            if aligned is not None:  # the step again, on the aux model aligned on its upload (same z)
                out = self._mapped(aligned, batch, counts, lr, keys, drawn)
        return LocalStep(as_state(out.state), out.per_client[0])

    def _mapped(self, state: State, batch, counts, lr: float, keys, drawn: Tensors | None) -> Mapped:
        fn: ClientFn = self.local_step
        inputs: tuple[Tensors, ...] = ()
        if self.private_step is not None and drawn is not None:
            fn, inputs = self.private_step, (drawn,)
        return self.executor.map(
            fn,
            state=state,
            batch=batch,
            shared=(lr,),
            counts=counts,
            inputs=inputs,
            keys=keys,
            stage="sage step",
        )
