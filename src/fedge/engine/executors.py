"""Executors: how a group of clients runs its local steps.

``SequentialExecutor`` is the reference: one client after another, each step on the client's real
batch. ``BatchedExecutor`` runs the same step for many clients at once under ``torch.func.vmap``.
Same plan, same step, same numbers up to floating-point reassociation.

How the batched executor stays close to the hardware's speed:

* The schedule lives on the host. Clients are ordered by their number of steps (longest first), so
  the clients still training at step ``s`` are a prefix of the order: a step trains that prefix as
  views of the stacked state, with no masking, no wasted work on finished clients, and no device
  synchronisation (the step counts are known before the loop).
* One gather per step: every active client's batch is read from the device-resident dataset with a
  single ``index_select`` into a buffer reused across steps, never a Python loop over clients.
* For a :class:`~fedge.engine.step.Step`, every client's loss comes from one vmapped forward pass and
  their gradients from one plain backward pass of the summed losses (each client's loss depends on
  its own rows of the stacked state only), and the optimizer then updates the stacked state in place
  (:meth:`SGD.update_`), one pass over memory instead of allocating a new copy of every client's
  parameters at every step. Plain autograd rather than ``torch.func.grad`` under ``vmap``: the
  transform keeps about twice the activations for its backward pass (one W9 GPT-2 client step:
  387 MB against 171 MB), and activations are what bounds a transformer's batch of clients.
* Clients are trained in equal chunks whose gradients stay under ``chunk_bytes``, so a round's peak
  memory stays near the stacked state itself however many clients train; clients are independent
  during local training, so chunking does not change any number.
* A dense network (``Linear`` and ``ReLU`` layers, cross-entropy) skips autograd altogether: a
  hand-written stacked kernel folds SGD's update into each weight-gradient product, or gives another
  optimizer its gradients in buffers reused across steps, so no step allocates a gradient
  (:mod:`fedge.engine.dense`; ``fused=False`` turns it off).
* Optionally the vmapped gradient is compiled with ``torch.compile`` (``compile_step``).

Besides whole local epochs of one step function (:meth:`Executor.train`), an executor maps any pure
per-client function over stacked state and batches (:meth:`Executor.map`): split learning stops at every
batch to exchange smashed data and gradients with a server, so it drives its own step loop through
``map``. Both executors give the same numbers for both; random layers draw from keyed noise streams
(:mod:`fedge.engine.noise`), so a client's dropout masks are the same on either executor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.func import vmap

from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine.bank import ClientBank
from fedge.engine.dense import DenseKernel, dense_kernel
from fedge.engine.folded import FoldedKernel, clients_per_fold, folded_kernel
from fedge.engine.host import REUSED_BLOCK_BYTES, release_free_memory, retaining_memory
from fedge.engine.kernels import batched_kernels
from fedge.engine.noise import NoiseStreams, RowKeys, keyed_noise
from fedge.engine.private_chain import PrivateChainKernel, clients_per_chain, private_chain_kernel
from fedge.engine.private_step import PrivateStep, step_keys
from fedge.engine.step import Step, StepFn, grad_leaves, leaf_gradients
from fedge.tensors import Tensors, rows

State = tuple[Tensors, Tensors, Tensors]
# (params, buffers, opt_state, x, y, weight, lr, keys) -> per-client loss; updates the state in place
Kernel = Callable[..., torch.Tensor]
# fn(*state, *inputs, *batch, *shared) -> Mapped(state, per_client, per_sample) of one client
ClientFn = Callable[..., "Mapped"]

CHUNK_BYTES = 64 * 2**20
# training activations of the clients trained (or kept for a split step's pullback) at once, where the
# runner has not set a quarter of the memory available; see Executor.activation_chunk
ACTIVATION_BYTES = 2**30
# batch inputs of one vmapped ``map`` call; see BatchedExecutor.map_chunk_size
MAP_CHUNK_BYTES = 6 * 2**20


class Mapped(NamedTuple):
    """What a per-client function returns, and what :meth:`Executor.map` returns stacked over clients:
    the new state (one dict per state argument), per-client values (e.g. the loss) and per-sample
    tensors (e.g. smashed data, zero past each client's real rows)."""

    state: tuple[Tensors, ...] = ()
    per_client: tuple[torch.Tensor, ...] = ()
    per_sample: tuple[torch.Tensor, ...] = ()


@dataclass(frozen=True)
class TwoForms:
    """A per-client function in two forms that compute the same numbers: ``pure`` (``torch.func``, for
    ``vmap``) and ``eager`` (plain autograd, for one client at a time). Calling it calls ``pure``; the
    sequential executor calls ``eager``, which skips ``torch.func``'s per-call transforms and pytree work."""

    pure: ClientFn
    eager: ClientFn

    def __call__(self, *args: Any) -> Mapped:
        return self.pure(*args)


class ClientFailed(RuntimeError):
    """A client's computation raised: which client (row), at which stage, and the original error."""

    def __init__(self, who: str, stage: str, error: BaseException):
        super().__init__(f"{who}, {stage}: {type(error).__name__}: {error}")
        self.who, self.stage = who, stage


class Executor(ABC):
    """Runs clients' local work on stacked state: whole local epochs (:meth:`train`) or one pure
    per-client function (:meth:`map`). ``noise`` is the run's keyed noise root (None: the model has no
    random layers, and no key is drawn)."""

    name: str
    noise: NoiseStreams | None = None
    sample_bytes: int = 0  # training activations of one sample (0: unknown); set by the runner
    cut_sample_bytes: int = 0  # the same for a split model's client part (0: unknown)
    activation_budget: int = ACTIVATION_BYTES  # set by the runner: a quarter of the memory available

    def clients_at_once(self, count: int, rows: int) -> int:
        """How many of ``count`` clients train together on batches of ``rows`` samples (one here)."""
        return min(count, 1)

    @abstractmethod
    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        """Update ``bank`` by the steps of ``plan``; return each client's mean training loss.

        A bank that owns its tensors (:attr:`ClientBank.owned`) is trained in place; any other bank is
        given new tensors, and the tensors it held are left as they were. The call is one phase of the
        round's noise stream: step ``s`` of row ``r`` draws from ``keys.at(s)[r]``.
        """

    @abstractmethod
    def map(
        self,
        fn: ClientFn,
        *,
        state: tuple[Tensors, ...],
        batch: tuple[torch.Tensor, ...],
        shared: tuple[Any, ...],
        counts: torch.Tensor,
        inputs: tuple[Tensors, ...] = (),
        keys: torch.Tensor | None = None,
        stage: str = "map",
    ) -> Mapped:
        """``fn`` for every client with ``counts > 0``, stacked over clients.

        ``fn(*state, *inputs, *batch, *shared)`` sees one client's rows: ``state`` and read-only
        ``inputs`` are per-client dicts, ``batch`` tensors ``[clients, B, ...]`` (client c's first
        ``counts[c]`` rows are real), ``shared`` values the same for all. An inactive client keeps its
        state and gets zero outputs; per-sample outputs are zero past ``counts``. ``keys[c]`` is client
        c's noise key for this call (from :meth:`phase_keys`); ``stage`` names the call in errors.
        """

    def phase_keys(self, clients: Iterable[int]) -> RowKeys | None:
        """Noise keys of the rows ``clients`` for the next training phase (None without random layers)."""
        return None if self.noise is None else self.noise.next_phase(clients)

    def forward_with_vjp(
        self,
        fn: ClientFn,
        params: Tensors,
        buffers: Tensors,
        x: torch.Tensor,
        counts: torch.Tensor,
        keys: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Tensors, Callable[[torch.Tensor], Tensors]]:
        """Stacked smashed data of ``fn(buffers, params, x) -> Mapped((buffers,), (), (z,))``, the new
        buffers, and the pullback that turns cut-layer gradients ``dL/dz`` into stacked parameter
        gradients. One forward pass (:meth:`map`, vmapped on the batched executor) on plain autograd;
        the pullback is one ``autograd.grad`` call that reuses it (so dropout masks stay consistent).
        Plain autograd rather than ``torch.func.vjp``: the transform keeps about twice the activations
        for its backward pass (a GPT-2 client step: 387 MB against 171 MB).

        The graph lives from the upload until the server's gradients return, for every row at once. When
        the rows' training activations (the client part's, :attr:`cut_sample_bytes`) would pass the
        budget of :meth:`activation_chunk` (many clients of a language model), the forward pass keeps
        no graph and the pullback recomputes it a chunk of rows at a time: one more client-side forward
        pass for memory bounded by a chunk. The recomputed pass reads the same rows, keys and buffers,
        so it gives the same numbers.
        """
        size = self.activation_chunk(x.shape[1], self.cut_sample_bytes or self.sample_bytes)
        if len(counts) > size:
            return self._recomputed_vjp(fn, params, buffers, x, counts, keys, size)
        leaves = grad_leaves(params)
        with torch.enable_grad():
            out = self.map(
                fn, state=(buffers,), batch=(x,), shared=(), counts=counts, inputs=(leaves,), keys=keys,
                stage="forward",
            )
        z = out.per_sample[0]
        pullback = partial(leaf_gradients, z, leaves)
        return z.detach(), {name: b.detach() for name, b in out.state[0].items()}, pullback

    def _recomputed_vjp(self, fn, params, buffers, x, counts, keys, size):
        """:meth:`forward_with_vjp` without a kept graph: the pullback recomputes ``size`` rows at a time.
        The forward pass maps the same chunks of rows, so both passes take the same path (one row runs
        the sequential kernels, several the batched ones) and round alike; a chunk with no active row
        computes nothing and sends zeros."""
        chunks = [slice(start, start + size) for start in range(0, len(counts), size)]
        active = [bool((counts[part] > 0).any()) for part in chunks]
        active[0] = active[0] or not any(active)  # an all-idle call maps as map does (for its shapes)

        def forward(part: slice, weights: Tensors) -> Mapped:
            return self.map(
                fn, state=(rows(buffers, part),), batch=(x[part],), shared=(), counts=counts[part],
                inputs=(weights,), keys=None if keys is None else keys[part], stage="forward",
            )

        with torch.no_grad():
            outs = [
                forward(part, rows(params, part)) if on else None
                for part, on in zip(chunks, active, strict=True)
            ]
        template = next(o for o in outs if o is not None)
        outs = [
            o if o is not None else _idle(template, rows(buffers, part), len(counts[part]))
            for o, part in zip(outs, chunks, strict=True)
        ]
        out = outs[0] if len(outs) == 1 else _concatenated(outs)

        def pullback(grad_z: torch.Tensor) -> Tensors:
            grads = []
            for part, on in zip(chunks, active, strict=True):
                leaves = grad_leaves(rows(params, part))
                if not on:  # nothing sent, nothing to differentiate
                    grads.append({name: torch.zeros_like(p) for name, p in leaves.items()})
                    continue
                with torch.enable_grad():
                    again = forward(part, leaves)
                grads.append(leaf_gradients(again.per_sample[0], leaves, grad_z[part]))
            return {name: torch.cat([g[name] for g in grads]) for name in params}

        return out.per_sample[0], out.state[0], pullback

    def activation_chunk(self, rows: int, sample_bytes: int | None = None) -> int:
        """Clients whose training activations on batches of ``rows`` samples (``sample_bytes`` each,
        by default the whole model's :attr:`sample_bytes`) fit in :attr:`activation_budget`; unbounded
        while that size is unknown. A transformer's activations, not its adapters, are what a batch of
        clients holds: one W9 GPT-2 client's step holds about 250 MB, 6,000 times its adapters.
        """
        per_client = rows * (self.sample_bytes if sample_bytes is None else sample_bytes)
        return max(1, self.activation_budget // per_client) if per_client else 2**62


def _equal_chunks(count: int, fits: int) -> int:
    """Clients per chunk: the fewest equal chunks of at most ``fits`` clients that hold ``count``."""
    chunks = -(-count // max(fits, 1))
    return max(1, -(-count // max(chunks, 1)))


def _destination(bank: ClientBank) -> State:
    """Where trained state goes: the bank's own tensors if it owns them, else new (uninitialised) ones."""
    if bank.owned:
        return bank.params, bank.buffers, bank.opt_state

    def fresh(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)

    return _each((bank.params, bank.buffers, bank.opt_state), fresh)


def _copy_into(targets: Tensors, values: Tensors) -> None:
    for name, target in targets.items():
        target.copy_(values[name])


class SequentialExecutor(Executor):
    """Reference executor: a Python loop over clients and their real batches.

    A :class:`~fedge.engine.step.Step` runs on plain autograd and updates the client's row of the
    trained state in place (:meth:`Step.eager_gradients`, :meth:`SGD.update_`): the same numbers as
    the pure step, at the cost of a hand-written PyTorch loop rather than of ``torch.func``'s
    transforms.
    """

    name = "sequential"

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        return _train_one_at_a_time(self.phase_keys(bank.clients), step, bank, plan, data, lr)

    def map(self, fn, *, state, batch, shared, counts, inputs=(), keys=None, stage="map") -> Mapped:
        return _map_one_at_a_time(fn, state, batch, shared, counts, inputs, keys, stage)


def _train_one_at_a_time(
    keys: RowKeys | None, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
) -> torch.Tensor:
    """:meth:`Executor.train` one client after another on its real batches (``keys``: the phase's noise
    keys of the bank's rows)."""
    source = (bank.params, bank.buffers, bank.opt_state)
    destination = _destination(bank)
    grid = None if keys is None else keys.grid(plan.num_steps)
    private = step if isinstance(step, PrivateStep) else None
    private_keys = None if private is None else step_keys(private, bank.clients, plan, grid)
    losses = torch.zeros(len(bank), device=data.device)
    in_place = step if isinstance(step, (Step, PrivateStep)) else None  # updates the row in place
    real = _real_rows(plan)
    for r in range(len(bank)):
        params, buffers, opt_state = (rows(tensors, r) for tensors in source)
        if in_place is not None:  # stepped in place in the destination's row (a view: nothing to copy back)
            params, opt_state = rows(destination[0], r), rows(destination[2], r)
            if not bank.owned:
                _copy_into(params, rows(source[0], r))
                _copy_into(opt_state, rows(source[2], r))
        total = torch.zeros((), device=data.device)
        steps = int(plan.steps[r])
        for s in range(steps):
            idx, weight = real(r, s)
            x, y = data.x_train[idx], data.y_train[idx]
            noise = keyed_noise(None if grid is None or private is not None else grid[r, s])
            with _failing(f"client {bank.clients[r]}", f"local step {s}"), noise:
                if private is not None and private_keys is not None:
                    width, at = plan.index.shape[2], private_keys[r, s]
                    loss = private.step_(params, buffers, opt_state, x, y, weight, lr, at, width, False)
                elif isinstance(in_place, Step):
                    grads, loss, buffers = in_place.eager_gradients(params, buffers, x, y, weight)
                    in_place.optimizer.update_(params, grads, opt_state, lr)
                else:
                    params, buffers, opt_state, loss = step(params, buffers, opt_state, x, y, weight, lr)
            total = total + loss
        losses[r] = total / max(steps, 1)
        new_state = zip(destination, (params, buffers, opt_state), strict=True)
        # in place: only the buffers are new
        copies = [(destination[1], buffers)] if in_place is not None else new_state
        for targets, values in copies:
            _copy_into(rows(targets, r), values)
    if not bank.owned:
        bank.adopt(*destination, owned=False)
    return losses


def _map_one_at_a_time(
    fn: ClientFn,
    state: tuple[Tensors, ...],
    batch: tuple[torch.Tensor, ...],
    shared: tuple[Any, ...],
    counts: torch.Tensor,
    inputs: tuple[Tensors, ...],
    keys: torch.Tensor | None,
    stage: str,
) -> Mapped:
    """:meth:`Executor.map` one active client after another, on its real rows."""
    call = fn.eager if isinstance(fn, TwoForms) else fn
    active = [int(c) for c in counts]
    if not any(active):
        raise ValueError("no active client: counts are all zero")
    width = batch[0].shape[1] if batch else 0
    outs: list[Mapped | None] = []
    for r, count in enumerate(active):
        if count == 0:
            outs.append(None)
            continue
        args = [rows(s, r) for s in (*state, *inputs)] + [b[r, :count] for b in batch]
        with _failing(f"row {r}", stage), keyed_noise(None if keys is None else keys[r]):
            outs.append(call(*args, *shared))
    return _stacked(outs, state, width)


def _real_rows(plan: BatchPlan) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """``(r, s) ->`` the sample indices and (all-one) weights of row ``r``'s real samples at step ``s``.

    Plans pad only at the end of a batch (a short last batch, steps past a client's end), so the real
    samples are a prefix and a slice of the plan finds them without a boolean gather per step; a plan
    padded elsewhere is read with :meth:`BatchPlan.client_batch`.
    """
    real = plan.weight > 0
    counts = real.sum(dim=-1)
    width = plan.index.shape[-1]
    if not bool((real == (torch.arange(width, device=real.device) < counts[..., None])).all()):
        return lambda r, s: (idx := plan.client_batch(r, s), torch.ones(len(idx), device=idx.device))
    sizes = counts.tolist()
    return lambda r, s: (plan.index[r, s, : sizes[r][s]], plan.weight[r, s, : sizes[r][s]])


def _keyed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a leading noise-key argument that its random layers draw from."""

    def call(key: torch.Tensor, *args: Any) -> Any:
        with keyed_noise(key):
            return fn(*args)

    return call


def _vmapped(fn: Callable[..., Any], in_dims: tuple, keyed: bool, compile_step: bool) -> Callable[..., Any]:
    """``fn`` under vmap (with a leading per-client key when ``keyed``), compiled on request."""
    mapped = (
        vmap(_keyed(fn), in_dims=(0, *in_dims), randomness="different")
        if keyed
        else vmap(fn, in_dims=in_dims, randomness="different")
    )
    return torch.compile(mapped, dynamic=False) if compile_step else mapped


def _kernels(compile_step: bool) -> Callable[[], AbstractContextManager[Any]]:
    """fedge's CPU kernels (per-client convolutions, pooling as maxima) for eager vmapped steps; a
    compiled step keeps PyTorch's own (the compiler does not trace a custom function's vmap rule)."""
    return nullcontext if compile_step else batched_kernels


def _step_kernel(step: Step, keyed: bool, compile_step: bool) -> Kernel:
    """Every client's loss in one vmapped forward pass, their gradients by one plain backward pass,
    then the optimizer's in-place update of the stacked state."""
    losses = _vmapped(step.loss_fn, (0,) * 5, keyed, compile_step)
    kernels = _kernels(compile_step)

    def run(params, buffers, opt_state, x, y, weight, lr, keys):
        leaves = grad_leaves(params)
        with kernels(), torch.enable_grad():
            args = (leaves, buffers, x, y, weight)
            loss, new_buffers = losses(keys, *args) if keyed else losses(*args)
            grads = leaf_gradients(loss.sum(), leaves)
        loss, new_buffers = loss.detach(), {name: b.detach() for name, b in new_buffers.items()}
        step.optimizer.update_(params, grads, opt_state, lr)
        _copy_into(buffers, new_buffers)
        return loss

    return run


@dataclass(frozen=True)
class PrivateKernel:
    """DP-SGD on every active row at once: per-sample gradients under a vmap over the rows, each row's
    noise from its keys (``keys[r]``: privacy key, dropout key), over the batch width."""

    step: PrivateStep

    def __call__(self, params, buffers, opt_state, x, y, weight, lr, keys) -> torch.Tensor:
        return self.step.step_(params, buffers, opt_state, x, y, weight, lr, keys, x.shape[1], True)


def _vmapped_kernel(step: StepFn, keyed: bool, compile_step: bool) -> Kernel:
    """``step`` vmapped: :func:`_step_kernel` for a :class:`Step`, else :func:`_generic_kernel`."""
    if isinstance(step, Step):
        return _step_kernel(step, keyed, compile_step)
    return _generic_kernel(step, keyed, compile_step)


def _generic_kernel(step: StepFn, keyed: bool, compile_step: bool) -> Kernel:
    """Any pure step function under vmap; its new state is copied into the stacked state."""
    stepped = _vmapped(step, (0, 0, 0, 0, 0, 0, None), keyed, compile_step)
    kernels = _kernels(compile_step)

    def run(params, buffers, opt_state, x, y, weight, lr, keys):
        with kernels():
            args = (params, buffers, opt_state, x, y, weight, lr)
            new_params, new_buffers, new_state, loss = stepped(keys, *args) if keyed else stepped(*args)
        for targets, values in ((params, new_params), (buffers, new_buffers), (opt_state, new_state)):
            _copy_into(targets, values)
        return loss

    return run


class BatchedExecutor(Executor):
    """All active clients step together under ``vmap``, in chunks of bounded memory.

    ``chunk_clients`` fixes the number of clients per chunk; by default the clients are split into the
    fewest equal chunks whose gradients (one more copy of the chunk's parameters, the largest per-step
    temporary of a dense model) fit in ``chunk_bytes`` and whose training activations fit in
    :meth:`activation_chunk`'s budget (known once the runner sets :attr:`sample_bytes`). The default,
    64 MiB, keeps 100 MLP 784-200-10 clients in one chunk; larger chunks were no faster on a 2-core
    CPU and raised the peak memory (1,000 such clients: 1.35 GB peak in chunks of 100, 1.89 GB in
    chunks of 200, at the same speed). A bank of one client has nothing to batch: it trains as the
    sequential executor does, on its real rows with the same kernels, so single-learner runs give
    identical numbers on both; likewise a :meth:`map` or :meth:`forward_with_vjp` of one client (split
    learning's ``server_order: client_after_client`` maps each client in turn), where ``vmap``'s
    per-call work cost 2-3 times the sequential executor's round (benchmarks/server_order.py).
    Without the allocator switch (:mod:`fedge.engine.host`) the budget is at most 32 MiB, glibc's
    largest reused block: a larger gradient would be mapped and zero-filled anew at every step
    (measured on W1, allocator off: chunks of 50 clients about 35 % faster than one chunk of 100).
    ``compile_step`` compiles the vmapped step with ``torch.compile`` (one compiled kernel per step
    object, kept for the executor's lifetime; the first rounds pay the compilation). With ``fused``
    (the default) a dense network's step runs as :class:`~fedge.engine.dense.DenseKernel` instead of
    vmapped autograd, compiled or not: the same gradients, rounded differently (numbers agree with the
    sequential executor to about 1e-8 per step rather than bit for bit).
    """

    name = "batched"

    def __init__(
        self,
        compile_step: bool = False,
        chunk_clients: int | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        fused: bool = True,
    ):
        if chunk_clients is not None and chunk_clients < 1:
            raise ValueError("chunk_clients must be at least 1")
        self.compile_step = compile_step
        self.chunk_clients = chunk_clients
        self.chunk_bytes = chunk_bytes
        self.fused = fused
        self._compiled: dict[tuple[StepFn, bool], Kernel] = {}

    def _kernel(self, step: StepFn, keyed: bool, sample_shape: tuple[int, ...], trained: Tensors) -> Kernel:
        if isinstance(step, PrivateStep):
            chain = private_chain_kernel(step, sample_shape, trained) if self.fused else None
            return chain or PrivateKernel(step)
        if self.fused and not keyed and isinstance(step, Step):
            fused = dense_kernel(step, sample_shape, trained) or folded_kernel(step)
            if fused is not None:
                return fused
        if not self.compile_step:
            return _vmapped_kernel(step, keyed, False)
        if (step, keyed) not in self._compiled:
            self._compiled[step, keyed] = _vmapped_kernel(step, keyed, True)
        return self._compiled[step, keyed]

    def chunk_size(
        self, bank: ClientBank, plan: BatchPlan, data: FederatedData, kernel: Kernel | None = None
    ) -> int:
        """Clients per chunk: ``chunk_clients``, or equal chunks whose gradients fit in ``chunk_bytes``
        (every client at once for a :class:`~fedge.engine.dense.DenseKernel`, which makes no gradient;
        a :class:`~fedge.engine.private_chain.PrivateChainKernel` holds per-sample gradients of its
        convolutions only, in chunks of at most :func:`~fedge.engine.private_chain.clients_per_chain`)."""
        if self.chunk_clients is not None:
            return self.chunk_clients
        count = len(bank)
        fits = self.activation_chunk(plan.index.shape[2])
        if not isinstance(kernel, DenseKernel):
            held = kernel.per_sample if isinstance(kernel, PrivateChainKernel) else tuple(bank.params)
            grads = sum(bank.params[name][0].numel() * bank.params[name].element_size() for name in held)
            if isinstance(kernel, (PrivateKernel, PrivateChainKernel)):
                grads *= plan.index.shape[2]  # DP-SGD holds every sample's gradient (of those tensors)
            budget = self.chunk_bytes if retaining_memory() else min(self.chunk_bytes, REUSED_BLOCK_BYTES)
            fits = min(fits, max(1, budget // max(1, grads)))
        if isinstance(kernel, PrivateChainKernel):
            fits = min(fits, clients_per_chain(data.device) or fits)
        if isinstance(kernel, FoldedKernel):
            positions = plan.index.shape[2] * data.x_train[0].numel()
            fits = min(fits, clients_per_fold(data.device, positions) or fits)
        return _equal_chunks(count, fits)

    def clients_at_once(self, count: int, rows: int) -> int:
        if self.chunk_clients is not None:
            return min(count, self.chunk_clients)
        return min(count, _equal_chunks(count, self.activation_chunk(rows)))

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        if len(bank) == 1 and not self.compile_step:  # nothing to batch: the sequential kernels, exactly
            return _train_one_at_a_time(self.phase_keys(bank.clients), step, bank, plan, data, lr)
        count = len(bank)
        steps = plan.steps.cpu().numpy()
        order = np.argsort(-steps, kind="stable")
        source = (bank.params, bank.buffers, bank.opt_state)
        destination = _destination(bank)
        keys = self.phase_keys(bank.clients)
        grid = None if keys is None else keys.grid(plan.num_steps)
        if isinstance(step, PrivateStep):
            grid = step_keys(step, bank.clients, plan, grid)
        kernel = self._kernel(step, grid is not None, tuple(data.x_train.shape[1:]), bank.params)
        size = min(self.chunk_size(bank, plan, data, kernel), max(count, 1))
        x_buffer = data.x_train.new_empty((size * plan.index.shape[2], *data.x_train.shape[1:]))
        totals = torch.zeros(count, device=data.device)
        for start in range(0, count, size):
            chunk = order[start : start + size]
            chunk_keys = None if grid is None else grid[torch.as_tensor(chunk, device=grid.device)]
            loss_sums = self._train_chunk(
                kernel, chunk, steps[chunk], source, destination, plan, data, lr, x_buffer, chunk_keys
            )
            totals[torch.as_tensor(chunk, device=data.device)] = loss_sums
        if not bank.owned:
            bank.adopt(*destination, owned=False)
        del x_buffer
        release_free_memory()
        denominators = torch.as_tensor(np.maximum(steps, 1), dtype=totals.dtype, device=data.device)
        return totals / denominators

    def map_chunk_size(self, batch: tuple[torch.Tensor, ...], count: int) -> int:
        """Clients per vmapped call of :meth:`map`: as many as keep their batch inputs under
        ``MAP_CHUNK_BYTES`` (all of them when ``chunk_clients`` is unset and there is no batch).

        A convolutional model's activations are a few times its input (LeNet-5's first is 4.4 times a
        28 x 28 image), and ``map`` steps allocate them anew at every step. Kept under 6 MiB of input,
        a chunk's activations stay under glibc's 32 MiB reuse limit and in the cache for longer: a
        100-client CSE-FSL round (W4) took 4.5 s in one call, 3.6 s in two of 50 clients, and no less
        in three or four. A transformer's input is a few token ids whose activations are thousands of
        times larger, so the chunk also keeps them within :meth:`activation_chunk` (counting the whole
        model's activations, which errs high for one side of a cut). Clients are independent within a
        ``map`` call, so chunks change no number.
        """
        if self.chunk_clients is not None:
            return self.chunk_clients
        per_client = sum(t[0].numel() * t.element_size() for t in batch)
        if not per_client:
            return max(count, 1)
        chunks = -(-count * per_client // MAP_CHUNK_BYTES)
        size = max(1, -(-count // max(chunks, 1)))
        fits = self.activation_chunk(batch[0].shape[1])
        return size if size <= fits else _equal_chunks(count, fits)

    def map(self, fn, *, state, batch, shared, counts, inputs=(), keys=None, stage="map") -> Mapped:
        if len(counts) == 1:  # one client (a split round client after client): the sequential kernels
            return _map_one_at_a_time(fn, state, batch, shared, counts, inputs, keys, stage)
        in_dims = (0,) * (len(state) + len(inputs) + len(batch)) + (None,) * len(shared)
        keyed = keys is not None
        folded = getattr(fn, "folded", None) if self.fused and not keyed else None  # clients in one batch
        mapped = folded or _vmapped(fn, in_dims, keyed, False)
        size = self.map_chunk_size(batch, len(counts))
        if folded is not None and batch and self.chunk_clients is None:
            size = min(size, clients_per_fold(batch[0].device, batch[0][0].numel()) or size)
        outs = []
        with batched_kernels():
            for start in range(0, len(counts), size):
                part = slice(start, start + size)
                args = (*(_each_row(t, part) for t in (*state, *inputs, *batch)), *shared)
                outs.append(mapped(keys[part], *args) if keyed else mapped(*args))
        out = outs[0] if len(outs) == 1 else _concatenated(outs)
        active = counts > 0
        if bool(active.all()):  # nothing to keep or zero: selecting the new values would copy them
            new_state, per_client = out.state, out.per_client
        else:
            new_state = tuple(_keep(active, new, old) for new, old in zip(out.state, state, strict=True))
            per_client = tuple(torch.where(active, v, torch.zeros_like(v)) for v in out.per_client)
        per_sample = out.per_sample
        if per_sample and not bool((counts == per_sample[0].shape[1]).all()):
            width = per_sample[0].shape[1]
            real = torch.arange(width, device=counts.device)[None, :] < counts[:, None]
            per_sample = tuple(
                v * real.to(v).reshape(*real.shape, *([1] * (v.dim() - 2))) for v in per_sample
            )
        return Mapped(new_state, per_client, per_sample)

    @staticmethod
    def _train_chunk(
        kernel: Kernel,
        chunk: np.ndarray,
        steps: np.ndarray,
        source: State,
        destination: State,
        plan: BatchPlan,
        data: FederatedData,
        lr: float,
        x_buffer: torch.Tensor,
        keys: torch.Tensor | None,
    ) -> torch.Tensor:
        """Train the bank rows ``chunk`` (ordered by descending ``steps``); their summed losses.

        ``keys[r, s]`` is the noise key of the chunk's row ``r`` at step ``s`` (None: no random layers).
        """
        first, count = int(chunk[0]), len(chunk)
        contiguous = bool(np.array_equal(chunk, np.arange(first, first + count)))
        if contiguous:
            block = slice(first, first + count)
            work = _block(destination, source, block)
            index, weight = plan.index[block], plan.weight[block]
        else:
            picked = torch.as_tensor(chunk, device=data.device)
            work = _each(source, lambda t: t.index_select(0, picked))
            index, weight = plan.index[picked], plan.weight[picked]
        shape = data.x_train.shape[1:]
        widths = _real_widths(weight, steps) if isinstance(kernel, FoldedKernel) else None
        loss_sums = torch.zeros(count, device=data.device)
        for s in range(int(steps[0]) if count else 0):
            active = int(np.count_nonzero(steps > s))
            batch = plan.index.shape[2] if widths is None else int(widths[s])
            idx = index[:active, s, :batch].reshape(-1)
            x = torch.index_select(data.x_train, 0, idx, out=x_buffer[: idx.numel()])
            targets = data.y_train.shape[1:]  # one target per sample, or per token of a sequence
            x, y = x.view(active, batch, *shape), data.y_train[idx].view(active, batch, *targets)
            params, buffers, opt_state = _first_rows(work, active)
            step_keys = None if keys is None else keys[:active, s]
            step_weight = weight[:active, s, :batch]
            loss_sums[:active] += kernel(params, buffers, opt_state, x, y, step_weight, lr, step_keys)
        if not contiguous:
            for stacked, tensors in zip(destination, work, strict=True):
                for name, t in tensors.items():
                    stacked[name].index_copy_(0, picked, t)
        return loss_sums


def _real_widths(weight: torch.Tensor, steps: np.ndarray) -> np.ndarray:
    """Per step, the batch columns up to the last real sample of any client still training then
    (``weight`` ``[rows, steps, batch]``, rows by descending ``steps``). A folded step trims the columns
    past it: a short last batch (every client's, when their sizes leave the same remainder) costs its real
    rows only, not a full batch of zero-weight padding."""
    real = (weight > 0).cpu().numpy()
    widths = np.ones(real.shape[1], dtype=np.int64)
    for s in range(real.shape[1]):
        columns = np.flatnonzero(real[: int(np.count_nonzero(steps > s)), s].any(axis=0))
        widths[s] = columns[-1] + 1 if columns.size else 1
    return widths


def _idle(template: Mapped, buffers: Tensors, count: int) -> Mapped:
    """A forward ``map`` output for ``count`` rows that have no sample: their buffers as they are and
    zero per-sample outputs shaped like ``template``'s."""
    return Mapped((buffers,), (), tuple(v.new_zeros(count, *v.shape[1:]) for v in template.per_sample))


def _each_row(value: Tensors | torch.Tensor, part: slice) -> Tensors | torch.Tensor:
    """Rows ``part`` of a stacked tensor or of every tensor of a dict."""
    return {name: t[part] for name, t in value.items()} if isinstance(value, dict) else value[part]


def _concatenated(outs: list[Mapped]) -> Mapped:
    """The outputs of consecutive chunks of clients as one stacked output."""
    first = outs[0]
    state = tuple(
        {name: torch.cat([o.state[i][name] for o in outs]) for name in tensors}
        for i, tensors in enumerate(first.state)
    )
    per_client = tuple(torch.cat([o.per_client[i] for o in outs]) for i in range(len(first.per_client)))
    per_sample = tuple(torch.cat([o.per_sample[i] for o in outs]) for i in range(len(first.per_sample)))
    return Mapped(state, per_client, per_sample)


def _each(state: State, fn: Callable[[torch.Tensor], torch.Tensor]) -> State:
    """``fn`` applied to every tensor of a (params, buffers, opt_state) triple."""
    params, buffers, opt_state = ({name: fn(t) for name, t in tensors.items()} for tensors in state)
    return params, buffers, opt_state


def _first_rows(state: State, count: int) -> State:
    """Views of the first ``count`` rows of every tensor of ``state``."""
    return _each(state, lambda t: t[:count])


def _block(destination: State, source: State, block: slice) -> State:
    """Views ``destination[block]`` holding ``source[block]`` (copied unless they are the same tensors)."""
    for targets, tensors in zip(destination, source, strict=True):
        for name, target in targets.items():
            if target is not tensors[name]:
                target[block].copy_(tensors[name][block])
    return _each(destination, lambda t: t[block])


def _stacked(outs: list[Mapped | None], state: tuple[Tensors, ...], width: int) -> Mapped:
    """Per-client outputs stacked over clients: an idle client (None) keeps its state and gets zeros;
    per-sample outputs are padded with zero rows to ``width``."""
    template = next(o for o in outs if o is not None)
    new_state = tuple(
        {
            name: torch.stack(
                [o.state[i][name] if o is not None else old[name][r] for r, o in enumerate(outs)]
            )
            for name in template.state[i]
        }
        for i, old in enumerate(state)
    )
    per_client = tuple(
        torch.stack([o.per_client[i] if o is not None else torch.zeros_like(v) for o in outs])
        for i, v in enumerate(template.per_client)
    )
    per_sample = tuple(
        torch.stack(
            [
                _pad_rows(o.per_sample[i], width) if o is not None else v.new_zeros(width, *v.shape[1:])
                for o in outs
            ]
        )
        for i, v in enumerate(template.per_sample)
    )
    return Mapped(new_state, per_client, per_sample)


def _pad_rows(t: torch.Tensor, count: int) -> torch.Tensor:
    """``t`` padded with zero rows to ``count`` rows (differentiable)."""
    missing = count - t.shape[0]
    return t if missing == 0 else torch.cat([t, t.new_zeros(missing, *t.shape[1:])])


def _keep(active: torch.Tensor, new: Tensors, old: Tensors) -> Tensors:
    """``new`` for active clients, ``old`` for the rest."""
    return {
        name: torch.where(active.reshape(-1, *([1] * (v.dim() - 1))), v, old[name]) for name, v in new.items()
    }


class _failing(AbstractContextManager):  # noqa: N801 - used like a function: ``with _failing(...):``
    """Re-raise an error of one client's computation as :class:`ClientFailed` naming it and the stage.

    A class rather than a generator: the sequential executor enters one per local step, and a
    generator-based context costs several times as much to enter and leave.
    """

    __slots__ = ("who", "stage")

    def __init__(self, who: str, stage: str):
        self.who, self.stage = who, stage

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        if isinstance(error, Exception) and not isinstance(error, ClientFailed):
            raise ClientFailed(self.who, self.stage, error) from error


EXECUTORS: dict[str, type[Executor]] = {"sequential": SequentialExecutor, "batched": BatchedExecutor}


def make_executor(name: str, compile_step: bool = False, fused: bool = True) -> Executor:
    """The executor registered as ``name``; ``compile_step`` and ``fused`` apply to the batched executor."""
    if name == "batched":
        return BatchedExecutor(compile_step=compile_step, fused=fused)
    return EXECUTORS[name]()
