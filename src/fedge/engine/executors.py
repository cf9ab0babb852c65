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
* For a :class:`~fedge.engine.step.Step`, gradients of all clients come from one vmapped call and
  the optimizer then updates the stacked state in place (:meth:`SGD.update_`), one pass over memory
  instead of allocating a new copy of every client's parameters at every step.
* Clients are trained in equal chunks whose gradients stay under ``chunk_bytes``, so a round's peak
  memory stays near the stacked state itself however many clients train; clients are independent
  during local training, so chunking does not change any number.
* Optionally the vmapped gradient is compiled with ``torch.compile`` (``compile_step``).

Random layers (dropout) draw from torch's global generator, which the caller seeds per round from the
run seed; under vmap the draws are made per client (``randomness="different"``), so runs are
reproducible per executor but dropout masks differ between the two executors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch
from torch.func import vmap

from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine.bank import ClientBank, row
from fedge.engine.convolution import conv_as_matmul
from fedge.engine.host import release_free_memory
from fedge.engine.step import Step, StepFn

Tensors = dict[str, torch.Tensor]
State = tuple[Tensors, Tensors, Tensors]
# (params, buffers, opt_state, x, y, weight, lr) -> per-client loss; updates the state in place
Kernel = Callable[[Tensors, Tensors, Tensors, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]

CHUNK_BYTES = 64 * 2**20


class Executor(ABC):
    """Runs the local steps of a plan for every client of a bank; returns the mean loss per client."""

    name: str

    @abstractmethod
    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        """Update ``bank`` by the steps of ``plan``; return each client's mean training loss.

        A bank that owns its tensors (:attr:`ClientBank.owned`) is trained in place; any other bank is
        given new tensors, and the tensors it held are left as they were.
        """


def _destination(bank: ClientBank) -> State:
    """Where trained state goes: the bank's own tensors if it owns them, else new (uninitialised) ones."""
    state = (bank.params, bank.buffers, bank.opt_state)
    if bank.owned:
        return state
    return tuple(
        {name: torch.empty(t.shape, dtype=t.dtype, device=t.device) for name, t in tensors.items()}
        for tensors in state
    )


def _copy_into(targets: Tensors, values: Tensors) -> None:
    for name, target in targets.items():
        target.copy_(values[name])


class SequentialExecutor(Executor):
    """Reference executor: a Python loop over clients and their real batches."""

    name = "sequential"

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        source = (bank.params, bank.buffers, bank.opt_state)
        destination = _destination(bank)
        losses = torch.zeros(len(bank), device=data.device)
        for r in range(len(bank)):
            params, buffers, opt_state = (row(tensors, r) for tensors in source)
            total = torch.zeros((), device=data.device)
            steps = int(plan.steps[r])
            for s in range(steps):
                idx = plan.client_batch(r, s)
                x, y = data.x_train[idx], data.y_train[idx]
                weight = torch.ones(len(idx), device=data.device)
                params, buffers, opt_state, loss = step(params, buffers, opt_state, x, y, weight, lr)
                total = total + loss
            losses[r] = total / max(steps, 1)
            for targets, values in zip(destination, (params, buffers, opt_state), strict=True):
                _copy_into(row(targets, r), values)
        if not bank.owned:
            bank.params, bank.buffers, bank.opt_state = destination
        return losses


def _step_kernel(step: Step, compile_step: bool) -> Kernel:
    """Vmapped gradients of all clients, then the optimizer's in-place update of the stacked state."""
    gradients = vmap(step.gradients, randomness="different")
    if compile_step:
        gradients = torch.compile(gradients, dynamic=False)

    def run(params, buffers, opt_state, x, y, weight, lr):
        with conv_as_matmul():
            grads, loss, new_buffers = gradients(params, buffers, x, y, weight)
        step.optimizer.update_(params, grads, opt_state, lr)
        _copy_into(buffers, new_buffers)
        return loss

    return run


def _generic_kernel(step: StepFn, compile_step: bool) -> Kernel:
    """Any pure step function under vmap; its new state is copied into the stacked state."""
    stepped = vmap(step, in_dims=(0, 0, 0, 0, 0, 0, None), randomness="different")
    if compile_step:
        stepped = torch.compile(stepped, dynamic=False)

    def run(params, buffers, opt_state, x, y, weight, lr):
        with conv_as_matmul():
            new_params, new_buffers, new_state, loss = stepped(params, buffers, opt_state, x, y, weight, lr)
        for targets, values in ((params, new_params), (buffers, new_buffers), (opt_state, new_state)):
            _copy_into(targets, values)
        return loss

    return run


class BatchedExecutor(Executor):
    """All active clients step together under ``vmap``, in chunks of bounded memory.

    ``chunk_clients`` fixes the number of clients per chunk; by default the clients are split into the
    fewest equal chunks whose gradients (one more copy of the chunk's parameters, the largest per-step
    temporary of a dense model; activations are not counted) fit in ``chunk_bytes``. The default,
    64 MiB, keeps 100 MLP 784-200-10 clients in one chunk; larger chunks were no faster on a 2-core
    CPU and raised the peak memory (1,000 such clients: 1.35 GB peak in chunks of 100, 1.89 GB in
    chunks of 200, at the same speed). ``compile_step`` compiles the vmapped step with
    ``torch.compile`` (one compiled kernel per step object, kept for the executor's lifetime; the first
    rounds pay the compilation).
    """

    name = "batched"

    def __init__(
        self, compile_step: bool = False, chunk_clients: int | None = None, chunk_bytes: int = CHUNK_BYTES
    ):
        if chunk_clients is not None and chunk_clients < 1:
            raise ValueError("chunk_clients must be at least 1")
        self.compile_step = compile_step
        self.chunk_clients = chunk_clients
        self.chunk_bytes = chunk_bytes
        self._compiled: dict[StepFn, Kernel] = {}

    def _kernel(self, step: StepFn) -> Kernel:
        build = _step_kernel if isinstance(step, Step) else _generic_kernel
        if not self.compile_step:
            return build(step, False)
        if step not in self._compiled:
            self._compiled[step] = build(step, True)
        return self._compiled[step]

    def chunk_size(self, bank: ClientBank, plan: BatchPlan, data: FederatedData) -> int:
        """Clients per chunk: ``chunk_clients``, or equal chunks whose gradients fit in ``chunk_bytes``."""
        if self.chunk_clients is not None:
            return self.chunk_clients
        count = len(bank)
        grads = sum(t[0].numel() * t.element_size() for t in bank.params.values())
        fits = max(1, self.chunk_bytes // max(1, grads))
        chunks = -(-count // fits)
        return max(1, -(-count // max(chunks, 1)))

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        count = len(bank)
        steps = plan.steps.cpu().numpy()
        order = np.argsort(-steps, kind="stable")
        source = (bank.params, bank.buffers, bank.opt_state)
        destination = _destination(bank)
        kernel = self._kernel(step)
        size = min(self.chunk_size(bank, plan, data), max(count, 1))
        x_buffer = data.x_train.new_empty((size * plan.index.shape[2], *data.x_train.shape[1:]))
        totals = torch.zeros(count, device=data.device)
        for start in range(0, count, size):
            rows = order[start : start + size]
            loss_sums = self._train_chunk(
                kernel, rows, steps[rows], source, destination, plan, data, lr, x_buffer
            )
            totals[torch.as_tensor(rows, device=data.device)] = loss_sums
        if not bank.owned:
            bank.params, bank.buffers, bank.opt_state = destination
        del x_buffer
        release_free_memory()
        denominators = torch.as_tensor(np.maximum(steps, 1), dtype=totals.dtype, device=data.device)
        return totals / denominators

    @staticmethod
    def _train_chunk(
        kernel: Kernel,
        rows: np.ndarray,
        steps: np.ndarray,
        source: State,
        destination: State,
        plan: BatchPlan,
        data: FederatedData,
        lr: float,
        x_buffer: torch.Tensor,
    ) -> torch.Tensor:
        """Train the bank rows ``rows`` (ordered by descending ``steps``); their summed losses."""
        first, count = int(rows[0]), len(rows)
        contiguous = bool(np.array_equal(rows, np.arange(first, first + count)))
        if contiguous:
            block = slice(first, first + count)
            work = _block(destination, source, block)
            index, weight = plan.index[block], plan.weight[block]
        else:
            picked = torch.as_tensor(rows, device=data.device)
            work = _map(source, lambda t: t.index_select(0, picked))
            index, weight = plan.index[picked], plan.weight[picked]
        batch, shape = plan.index.shape[2], data.x_train.shape[1:]
        loss_sums = torch.zeros(count, device=data.device)
        for s in range(int(steps[0]) if count else 0):
            active = int(np.count_nonzero(steps > s))
            idx = index[:active, s].reshape(-1)
            x = torch.index_select(data.x_train, 0, idx, out=x_buffer[: idx.numel()])
            x, y = x.view(active, batch, *shape), data.y_train[idx].view(active, batch)
            params, buffers, opt_state = _map(work, lambda t, n=active: t[:n])
            loss_sums[:active] += kernel(params, buffers, opt_state, x, y, weight[:active, s], lr)
        if not contiguous:
            for targets, tensors in zip(destination, work, strict=True):
                for name, t in tensors.items():
                    targets[name].index_copy_(0, picked, t)
        return loss_sums


def _map(state: State, fn: Callable[[torch.Tensor], torch.Tensor]) -> State:
    """``fn`` applied to every tensor of a (params, buffers, opt_state) triple."""
    return tuple({name: fn(t) for name, t in tensors.items()} for tensors in state)


def _block(destination: State, source: State, block: slice) -> State:
    """Views ``destination[block]`` holding ``source[block]`` (copied unless they are the same tensors)."""
    for targets, tensors in zip(destination, source, strict=True):
        for name, target in targets.items():
            if target is not tensors[name]:
                target[block].copy_(tensors[name][block])
    return _map(destination, lambda t: t[block])


EXECUTORS: dict[str, type[Executor]] = {"sequential": SequentialExecutor, "batched": BatchedExecutor}


def make_executor(name: str, compile_step: bool = False) -> Executor:
    """The executor registered as ``name``; ``compile_step`` applies to the batched executor."""
    if name == "batched":
        return BatchedExecutor(compile_step=compile_step)
    return EXECUTORS[name]()
