"""Server copies: one server model per participant row (SplitFed v1 = FSL_MC, FSL_AN), and the one-model
special case lightweight FedSL steps with the mean gradient (its Eq. 7)."""

from __future__ import annotations

import torch
from torch import nn

from fedge.algorithms.split.clients import State, as_state
from fedge.algorithms.split.server import CutBatch, DenseKernels, Served, SplitServer
from fedge.engine import Criterion, Executor, Optimizer, cross_entropy, stack_copies
from fedge.engine.dense import DenseKernel
from fedge.engine.split import make_server_step
from fedge.runtime.split import RowAggregation
from fedge.tensors import Tensors, rows


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
        sgd: Optimizer,
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
        self.copies: State = ({}, {}, {})
        self.first_copy: tuple[Tensors, Tensors] | None = None

    def begin(self, count: int) -> None:
        state = (self.params, self.buffers, self.sgd.init(self.params))
        self.copies = as_state(tuple(stack_copies(tensors, count) for tensors in state))

    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        """Step every sending row's copy on its batch; rows that send nothing (all of them, for a process
        whose rows idle at a step of a round spread over processes) keep their copies and get zeros."""
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
            state=copies,
            batch=(z, batch.y, weight),
            shared=(lr,),
            counts=counts,
            keys=batch.keys,
            stage="server copy",
        )
        if batch.rows is None:
            self.copies = as_state(out.state)
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
        if part_grad is None:  # no cut-layer gradient asked for
            return Served(loss, None)
        grads = torch.zeros_like(z)
        grads[at] = part_grad
        return Served(loss, grads)

    def aggregate(self, weights: torch.Tensor, aggregation: RowAggregation) -> None:
        """The copies' weighted average through the server's pipeline (by default each process sums its
        own copies, one all-reduce adds the sums), the global server model the copies started from as
        its reference; the first participant's copy (``copy0``) comes from the first process, which
        holds the cohort's first row."""
        params, buffers, _ = self.copies
        if self.evaluate_with == "copy0":
            self.first_copy = aggregation.from_first((rows(params, 0), rows(buffers, 0)))
        reference = {**self.params, **self.buffers}
        average = aggregation.average({**params, **buffers}, weights, reference)
        self.params = {name: average[name] for name in params}
        self.buffers = {name: average[name] for name in buffers}

    def models_held(self, count: int) -> int:
        return count

    def select_rows(self, keep: torch.Tensor) -> None:
        self.copies = as_state(tuple(rows(t, keep) for t in self.copies))

    def evaluation_model(self) -> tuple[Tensors, Tensors]:
        return self.first_copy or (self.params, self.buffers)


class MeanGradientServer(ServerCopies):
    """One server model stepped with the mean of its rows' gradients (lightweight FedSL, Eq. 7).

    All rows are served at the same weights (as parallel copies, so either executor runs them) and
    averaged uniformly at once, BatchNorm statistics too, so the statistics never mix clients within a
    batch. With plain SGD averaging the stepped copies is the step with the mean gradient (Eq. 6 = Eq. 7).
    The order of the rows does not matter, so on several processes each serves its own clients' rows
    (a batch of this process's rows, ``batch.cohort`` rows in all) and :meth:`step_mean` averages the
    processes' copies through the server's pipeline.
    """

    def serve(self, batch: CutBatch, lr: float, grad_z: bool, order: list[int]) -> Served:
        """Step a fresh copy per row of ``batch`` at the server model's weights (:meth:`step_mean` then
        averages them)."""
        self.begin(len(batch.counts))
        return super().serve(batch, lr, grad_z, order)

    def step_mean(self, batch: CutBatch, aggregation: RowAggregation) -> None:
        """The model's step with the mean gradient: the uniform average of the copies that served
        ``batch`` (Eq. 7 computed as Eq. 6)."""
        count = len(batch.counts)
        uniform = torch.full(
            (count,), 1.0 / (batch.cohort or count), dtype=torch.float64, device=batch.z.device
        )
        self.aggregate(uniform, aggregation)

    def models_held(self, count: int) -> int:
        return 1
