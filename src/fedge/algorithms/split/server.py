"""The server side of split learning, as a part with two shapes.

Every split algorithm's server receives the participants' cut batches (smashed data and labels), takes
SGD steps on its part of the model and, for SplitFed, returns the cut-layer gradients. What differs is
how many server models there are:

- :class:`ServerCopies`: one copy per participant (SplitFed v1 = FSL_MC, FSL_AN). Copies start each
  aggregation period from the global server model with fresh optimizer state, serve their own client's
  batches in parallel (under :meth:`~fedge.engine.Executor.map`, so either executor runs them) and are
  averaged with the client models (CSE-FSL Eq. 14 applied to the server side).
- :class:`SharedServer`: one model for everyone (SplitFed v2 = FSL_OC, CSE-FSL), fed by a queue: the
  batches of one step are served one after another in the order the caller gives (CSE-FSL Sec. II-E's
  deterministic simulation of the FIFO queue). Its optimizer state persists across rounds.

:class:`MeanGradientServer` is the copies' special case that lightweight FedSL needs (its Eq. 7): every
batch of a round is served at the same weights and the server steps once with the mean gradient,
computed as parallel copies averaged at once; it holds one model.

A part owns its model(s): starting a period (:meth:`SplitServer.begin`), serving a cut batch
(:meth:`SplitServer.serve`), aggregation, the storage it occupies and its checkpoint state. Transfers
are the algorithm's: the server part never touches a link.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from fedge.comm import state_bits
from fedge.distributed import SINGLE, Group
from fedge.engine import SGD, Criterion, Executor, cross_entropy, stack_copies, weighted_sum
from fedge.engine.dense import DenseKernel, server_kernel
from fedge.engine.noise import keyed_noise
from fedge.engine.split import make_server_step
from fedge.tensors import Tensors, rows

SERVER_STAGE = 1  # noise stage of server-side draws (the client part uses stage 0 of the same step)


class CutBatch(NamedTuple):
    """What reaches the server at one local step: rows ``rows`` of the round (None: all of them), their
    smashed data ``z`` ``[R, B, ...]`` and labels ``y`` ``[R, B]`` (row r's first ``counts[r]`` entries
    real; 0 = the row sends nothing), and each row's noise key for the server's random layers. ``cohort``
    is the number of rows of the whole cohort when the batch holds only one process's share of them (0:
    the batch is the whole cohort)."""

    rows: torch.Tensor | None
    z: torch.Tensor
    y: torch.Tensor
    counts: torch.Tensor
    keys: torch.Tensor | None = None
    cohort: int = 0


class Served(NamedTuple):
    """The server's answer: each row's loss (0 where it sent nothing) and, when asked, the cut-layer
    gradient of each row's batch (``dL/dz`` of the batch's mean loss at the pre-update weights)."""

    loss: torch.Tensor
    grad_z: torch.Tensor | None


class DenseKernels:
    """The dense kernel (:func:`~fedge.engine.dense.server_kernel`) of a server part, one per shape of
    smashed data; None where the part is not a dense chain or the batch carries noise keys (its random
    layers need autograd)."""

    def __init__(self, module: nn.Module, sgd: SGD, criterion: Criterion):
        self.module, self.sgd, self.criterion = module, sgd, criterion
        self.by_shape: dict[tuple[int, ...], DenseKernel | None] = {}

    def for_batch(self, batch: CutBatch) -> DenseKernel | None:
        if batch.keys is not None:
            return None
        shape = tuple(batch.z.shape[2:])
        if shape not in self.by_shape:
            self.by_shape[shape] = server_kernel(self.module, self.sgd, self.criterion, shape)
        return self.by_shape[shape]


class SplitServer(ABC):
    """The server part: its model(s), how a cut batch is served, aggregation and storage.

    ``in_turn`` says whether one model serves every upload in turn, so that its compute adds up over a
    round (the simulated clock's composition depends on it).
    """

    in_turn: ClassVar[bool] = False
    state_fields: ClassVar[tuple[str, ...]] = ("params", "buffers")

    def __init__(self, params: Tensors, buffers: Tensors, sgd: SGD):
        self.params = params
        self.buffers = buffers
        self.sgd = sgd

    @abstractmethod
    def begin(self, count: int) -> None:
        """Start an aggregation period of a round with ``count`` participant rows."""

    @abstractmethod
    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        """Take the server steps of one local step's uploads; ``order`` lists the sending rows (indices
        into ``batch``) in the order a single server model processes them."""

    @abstractmethod
    def aggregate(self, weights: torch.Tensor, group: Group = SINGLE) -> None:
        """End an aggregation period; ``weights`` (summing to 1 over the whole cohort) weigh the rows this
        process holds, and ``group`` adds up the processes' partial sums (docs/scale-out.md)."""

    @abstractmethod
    def models_held(self, count: int) -> int:
        """How many server models the server holds with ``count`` participant rows."""

    def storage_bits(self, count: int) -> int:
        """Bits of the server models held with ``count`` participant rows."""
        return self.models_held(count) * state_bits({**self.params, **self.buffers})

    def evaluation_model(self) -> tuple[Tensors, Tensors]:
        """The server parameters and buffers that evaluation composes with the global client model."""
        return self.params, self.buffers

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.state_fields}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.state_fields:
            setattr(self, name, state[name])


class ServerCopies(SplitServer):
    """One server copy per participant row, served in parallel through the executor's map.

    With ``fused`` a dense server part (as for :class:`SharedServer`) steps all sending copies at once
    by :class:`~fedge.engine.dense.DenseKernel`, in place and on either executor, so both still agree
    exactly; against the vmapped autograd step its numbers differ by rounding only (SGD's update is
    folded into the weight-gradient product).

    ``evaluate_with`` chooses the server model of evaluation: the average of the copies (``avg``) or the
    first participant's copy before averaging (``copy0``).
    """

    state_fields = (*SplitServer.state_fields, "first_copy")

    def __init__(
        self,
        module: nn.Module,
        params: Tensors,
        buffers: Tensors,
        sgd: SGD,
        clip_norm: float | None,
        executor: Executor,
        evaluate_with: str = "avg",
        criterion: Criterion = cross_entropy,
        fused: bool = False,
    ):
        super().__init__(params, buffers, sgd)
        self.executor = executor
        self.evaluate_with = evaluate_with
        self.steps = {
            grad: make_server_step(module, sgd, clip_norm, grad, True, criterion) for grad in (False, True)
        }
        self.dense = DenseKernels(module, sgd, criterion) if fused and clip_norm is None else None
        self.copies: tuple[Tensors, Tensors, Tensors] = ({}, {}, {})
        self.first_copy: tuple[Tensors, Tensors] | None = None

    def begin(self, count: int) -> None:
        state = (self.params, self.buffers, self.sgd.init(self.params))
        self.copies = tuple(stack_copies(tensors, count) for tensors in state)

    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        """Step every sending row's copy on its batch; rows that send nothing (all of them, for a process
        whose rows idle at a step of a sharded round) keep their copies and get zeros."""
        z, counts = batch.z, batch.counts
        if not bool(counts.any()):
            return Served(torch.zeros(len(counts), device=z.device), torch.zeros_like(z) if grad_z else None)
        weight = (torch.arange(z.shape[1], device=z.device)[None, :] < counts[:, None]).to(z)
        kernel = None if self.dense is None else self.dense.for_batch(batch)
        if kernel is not None:
            return self._serve_dense(kernel, batch, weight, lr, grad_z)
        copies = self.copies if batch.rows is None else tuple(rows(t, batch.rows) for t in self.copies)
        out = self.executor.map(
            self.steps[grad_z],
            copies,
            (z, batch.y, weight),
            (lr,),
            counts,
            keys=batch.keys,
            stage="server copy",
        )
        if batch.rows is None:
            self.copies = out.state
        else:
            for full, part in zip(self.copies, out.state, strict=True):
                for name, value in part.items():
                    full[name] = full[name].index_put((batch.rows,), value)
        return Served(out.per_client[0], out.per_sample[0] if grad_z else None)

    def _serve_dense(
        self, kernel: DenseKernel, batch: CutBatch, weight: torch.Tensor, lr: float, grad_z: bool
    ) -> Served:
        """:meth:`serve` by the dense kernel: the sending rows' copies step together, in place (gathered
        and written back where some rows send nothing or the batch holds a process's share)."""
        params, _, opt_state = self.copies
        z, y, counts = batch.z, batch.y, batch.counts
        sending = counts > 0
        if batch.rows is None and bool(sending.all()):
            return Served(*kernel.step(params, opt_state, z, y, weight, lr, grad_z))
        at = torch.nonzero(sending).flatten()
        held = at if batch.rows is None else batch.rows[at]
        part_params = {name: t[held] for name, t in params.items()}
        part_state = {name: t[held] for name, t in opt_state.items()}
        part_loss, part_grad = kernel.step(part_params, part_state, z[at], y[at], weight[at], lr, grad_z)
        for full, part in ((params, part_params), (opt_state, part_state)):
            for name, value in part.items():
                full[name][held] = value
        loss = torch.zeros(len(counts), device=z.device)
        loss[at] = part_loss
        if not grad_z:
            return Served(loss, None)
        grads = torch.zeros_like(z)
        grads[at] = part_grad
        return Served(loss, grads)

    def aggregate(self, weights: torch.Tensor, group: Group = SINGLE) -> None:
        """The copies' weighted average: each process sums its own copies, one all-reduce adds the sums;
        the first participant's copy (``copy0``) comes from rank 0, which holds the cohort's first row."""
        params, buffers, _ = self.copies
        if self.evaluate_with == "copy0":
            self.first_copy = group.broadcast((rows(params, 0), rows(buffers, 0)))
        average = group.sum_tensors({**weighted_sum(params, weights), **weighted_sum(buffers, weights)})
        self.params = {name: average[name] for name in params}
        self.buffers = {name: average[name] for name in buffers}

    def models_held(self, count: int) -> int:
        return count

    def evaluation_model(self) -> tuple[Tensors, Tensors]:
        return self.first_copy or (self.params, self.buffers)


class MeanGradientServer(ServerCopies):
    """One server model stepped with the mean of its rows' gradients (lightweight FedSL, Eq. 7).

    All rows are served at the same weights (as parallel copies, so either executor runs them) and
    averaged uniformly at once, BatchNorm statistics too, so the statistics never mix clients within a
    batch. With plain SGD averaging the stepped copies is the step with the mean gradient (Eq. 6 = Eq. 7).
    The order of the rows does not matter, so on several processes each serves its own clients' rows
    (a batch of one share, ``cohort`` rows in all) and ``group`` adds up the partial averages.
    """

    def __init__(
        self,
        module: nn.Module,
        params: Tensors,
        buffers: Tensors,
        sgd: SGD,
        clip_norm: float | None,
        executor: Executor,
        group: Group = SINGLE,
    ):
        super().__init__(module, params, buffers, sgd, clip_norm, executor)
        self.group = group

    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        count = len(batch.counts)
        self.begin(count)
        served = super().serve(batch, lr, grad_z, order)
        uniform = torch.full(
            (count,), 1.0 / (batch.cohort or count), dtype=torch.float64, device=batch.z.device
        )
        self.aggregate(uniform, self.group)
        return served

    def models_held(self, count: int) -> int:
        return 1


class SharedServer(SplitServer):
    """One server model for all participants; a step's uploads are served one after another in ``order``.

    Its steps use plain autograd (one batch at a time: half the per-call overhead of ``torch.func``) and
    its optimizer state persists across rounds. With ``fused`` a dense server part (``Linear`` and
    ``ReLU`` after a ``Flatten``, cross-entropy, no clipping, no random layers) steps by
    :class:`~fedge.engine.dense.DenseKernel` instead, as one client of a stack: the same gradients
    without an autograd graph, rounded once less per weight with SGD. The server is the same object on
    either executor, so both executors still agree exactly.
    """

    in_turn = True
    state_fields = (*SplitServer.state_fields, "opt_state")

    def __init__(
        self,
        module: nn.Module,
        params: Tensors,
        buffers: Tensors,
        sgd: SGD,
        clip_norm: float | None,
        criterion: Criterion = cross_entropy,
        fused: bool = False,
    ):
        super().__init__(params, buffers, sgd)
        self.opt_state = sgd.init(params)
        self.steps = {
            grad: make_server_step(module, sgd, clip_norm, grad, False, criterion) for grad in (False, True)
        }
        self.dense = DenseKernels(module, sgd, criterion) if fused and clip_norm is None else None

    def begin(self, count: int) -> None:
        """Nothing to prepare: the one model carries on."""

    def _serve_dense(
        self, kernel: DenseKernel, batch: CutBatch, lr: float, grad_z: bool, order: list[int]
    ) -> Served:
        """:meth:`serve` by the dense kernel, stepping private copies of the state in place (as a stack
        of one: the kernel's views add a leading dimension of size 1)."""
        z, y, counts = batch.z, batch.y, batch.counts
        loss = torch.zeros(len(counts), device=z.device)
        grads = torch.zeros_like(z) if grad_z else None
        params = {name: t.clone() for name, t in self.params.items()}
        opt_state = {name: t.clone() for name, t in self.opt_state.items()}
        stacked_params = {name: t.unsqueeze(0) for name, t in params.items()}
        stacked_state = {name: t.unsqueeze(0) for name, t in opt_state.items()}
        sizes, ones = counts.tolist(), torch.ones(1, z.shape[1], device=z.device)  # no sync inside the loop
        for r in order:
            c = sizes[r]
            step_loss, grad = kernel.step(
                stacked_params, stacked_state, z[r : r + 1, :c], y[r : r + 1, :c], ones[:, :c], lr, grad_z
            )
            loss[r] = step_loss[0]
            if grad_z:
                grads[r, :c] = grad[0]
        self.params, self.opt_state = params, opt_state
        return Served(loss, grads)

    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        kernel = None if self.dense is None else self.dense.for_batch(batch)
        if kernel is not None:
            return self._serve_dense(kernel, batch, lr, grad_z, order)
        z, y, counts = batch.z, batch.y, batch.counts
        loss = torch.zeros(len(counts), device=z.device)
        grads = torch.zeros_like(z) if grad_z else None
        params, buffers, opt_state = self.params, self.buffers, self.opt_state
        sizes, ones = counts.tolist(), torch.ones(z.shape[1], device=z.device)  # no sync inside the loop
        for r in order:
            c = sizes[r]
            with keyed_noise(None if batch.keys is None else batch.keys[r]):
                out = self.steps[grad_z](params, buffers, opt_state, z[r, :c], y[r, :c], ones[:c], lr)
            (params, buffers, opt_state), (loss[r],) = out.state, out.per_client
            if grad_z:
                grads[r, :c] = out.per_sample[0]
        self.params, self.buffers, self.opt_state = params, buffers, opt_state
        return Served(loss, grads)

    def aggregate(self, weights: torch.Tensor, group: Group = SINGLE) -> None:
        """Nothing to average: the one model already learned from everyone."""

    def models_held(self, count: int) -> int:
        return 1
