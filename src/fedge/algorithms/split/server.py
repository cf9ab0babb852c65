"""The server side of split learning, as a part with two shapes.

Every split algorithm's server receives the participants' cut batches (smashed data and labels), takes
SGD steps on its part of the model and, for SplitFed, returns the cut-layer gradients. What differs is
how many server models there are:

- :class:`~fedge.algorithms.split.copies.ServerCopies`: one copy per participant (SplitFed v1 = FSL_MC,
  FSL_AN). Copies start each aggregation period from the global server model with fresh optimizer
  state, serve their own client's batches in parallel (under :meth:`~fedge.engine.Executor.map`, so
  either executor runs them) and are averaged with the client models (CSE-FSL Eq. 14 applied to the
  server side).
- :class:`SharedServer`: one model for everyone (SplitFed v2 = FSL_OC, CSE-FSL), fed by a queue: the
  batches of one step are served one after another in the order the caller gives (CSE-FSL Sec. II-E's
  deterministic simulation of the FIFO queue). Its optimizer state persists across rounds.

:class:`~fedge.algorithms.split.copies.MeanGradientServer` is the copies' special case that lightweight
FedSL needs (its Eq. 7): every batch of a round is served at the same weights and the server steps once
with the mean gradient, computed as parallel copies averaged at once; it holds one model.

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
from fedge.engine import Criterion, Optimizer, cross_entropy
from fedge.engine.dense import DenseKernel, server_kernel
from fedge.engine.noise import keyed_noise
from fedge.engine.split import make_server_step
from fedge.runtime.split import RowAggregation
from fedge.tensors import Tensors

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
    samples: torch.Tensor | None = None  # each row's training-sample indices ``[R, B]`` (output.record)


class Served(NamedTuple):
    """The server's answer: each row's loss (0 where it sent nothing) and, when asked, the cut-layer
    gradient of each row's batch (``dL/dz`` of the batch's mean loss at the pre-update weights)."""

    loss: torch.Tensor
    grad_z: torch.Tensor | None


class DenseKernels:
    """The dense kernel (:func:`~fedge.engine.dense.server_kernel`) of a server part, one per shape of
    smashed data; None where the part is not a dense chain or the batch carries noise keys (its random
    layers need autograd)."""

    def __init__(self, module: nn.Module, sgd: Optimizer, criterion: Criterion):
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

    ``sequential`` says whether one model serves every upload in turn, so that its compute adds up over a
    round (the simulated clock's composition depends on it).
    """

    sequential: ClassVar[bool] = False
    state_fields: ClassVar[tuple[str, ...]] = ("params", "buffers")

    def __init__(self, params: Tensors, buffers: Tensors, sgd: Optimizer):
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
    def aggregate(self, weights: torch.Tensor, aggregation: RowAggregation) -> None:
        """End an aggregation period; ``weights`` (summing to 1 over the whole cohort) weigh the rows this
        process holds, averaged by the server's ``aggregation`` over the processes (docs/scale-out.md)."""

    @abstractmethod
    def models_held(self, count: int) -> int:
        """How many server models the server holds with ``count`` participant rows."""

    @abstractmethod
    def select_rows(self, keep: torch.Tensor) -> None:
        """Only the round's rows ``keep`` go on (a deployed round whose other rows' nodes dropped out)."""

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


class SharedServer(SplitServer):
    """One server model for all participants; a step's uploads are served one after another in ``order``.

    Its steps use plain autograd (one batch at a time: half the per-call overhead of ``torch.func``) and
    its optimizer state persists across rounds. With ``fused`` a dense server part (``Linear`` and
    ``ReLU`` after a ``Flatten``, cross-entropy, no clipping, no random layers) steps by
    :class:`~fedge.engine.dense.DenseKernel` instead, as one client of a stack: the same gradients
    without an autograd graph, rounded once less per weight with SGD. The server is the same object on
    either executor, so both executors still agree exactly.
    """

    sequential = True
    state_fields = (*SplitServer.state_fields, "opt_state")

    def __init__(
        self,
        module: nn.Module,
        params: Tensors,
        buffers: Tensors,
        sgd: Optimizer,
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
            if grads is not None and grad is not None:  # both exactly when grad_z
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
            if grads is not None:
                grads[r, :c] = out.per_sample[0]
        self.params, self.buffers, self.opt_state = params, buffers, opt_state
        return Served(loss, grads)

    def aggregate(self, weights: torch.Tensor, aggregation: RowAggregation) -> None:
        """Nothing to average: the one model already learned from everyone."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """One shared model has nothing per row."""

    def models_held(self, count: int) -> int:
        return 1
