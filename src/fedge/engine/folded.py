"""Clients folded into the batch: every client's samples in one plain pass over a shared frozen model.

A LoRA-adapted transformer trains only its adapters; everything else (embeddings, norms, attention, the
frozen projections) is the same for every client. Under ``vmap`` each shared product is still one
product over all clients' rows, but the rest of the model runs as ``vmap`` rewrites it: a biased
projection becomes a product and a separate addition, and attention cannot use PyTorch's fused kernel
(it has no batching rule), so its scores are written out and read back. On the W9 workload
(``benchmarks/llm.py``) that made the batched executor about 8 % slower than a per-client ``peft`` loop.

Folding runs the model once on a batch that holds every client's samples, client after client
(``[clients * batch, ...]``), with plain autograd: the shared layers are exactly the layers a
per-client loop runs, on a larger batch; only the adapters read per-client rows, as one batched product
per projection (:class:`~fedge.models.lora.LoRALinear` recognises stacked adapters). The clients'
losses are summed, so one backward pass gives every client's own adapter gradients (each loss reaches
only its client's adapters).

A module folds when it says so: each of its blocks declares ``folds_clients`` (it computes every sample
on its own, with no batch statistics, and every parameter it trains is a LoRA adapter) and it keeps no
buffers. Random layers (LoRA dropout) draw per-client keyed noise under ``vmap``, which a folded batch
cannot reproduce, so a run with random layers keeps the ``vmap`` path. Folded and ``vmap``ped steps
compute the same formulas; products of different shapes round differently (agreement about 1e-7). A
folded step also drops the batch columns past the last real sample of every client it trains (the
executor's ``_real_widths``): a short last batch costs its real rows, as on the sequential executor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedge.engine.bind import call_at
from fedge.engine.step import ClassificationLoss, Step, grad_leaves, leaf_gradients, weighted_mean
from fedge.tensors import Tensors

# token positions of one folded pass on a CPU. A pass over many clients' batches holds activations far
# larger than the cache, and its element-wise work (GELU, residual additions, norms) then runs from
# memory: a W9 FedAvg round of 8 clients took 6.05 s folded all at once, 5.84 s two clients (2,048
# positions) at a time. On a GPU a larger pass is what fills the device, so no bound applies there.
CPU_FOLD_POSITIONS = 2048


def folds_clients(module: nn.Module) -> bool:
    """Whether clients' batches can be folded into one batch of ``module`` (see the module docstring)."""
    blocks = list(module.children()) if isinstance(module, nn.Sequential) else [module]
    declared = bool(blocks) and all(getattr(block, "folds_clients", False) for block in blocks)
    return declared and next(module.buffers(), None) is None


def fold(batch: torch.Tensor) -> torch.Tensor:
    """``[clients, batch, ...]`` as one batch ``[clients * batch, ...]``, client after client."""
    return batch.reshape(-1, *batch.shape[2:])


def unfold(batch: torch.Tensor, clients: int) -> torch.Tensor:
    """A folded batch back as ``[clients, batch, ...]``."""
    return batch.reshape(clients, -1, *batch.shape[1:])


def folded_forward(module: nn.Module, params: Tensors, x: torch.Tensor) -> torch.Tensor:
    """``module`` at every client's stacked ``params`` on its rows of ``x`` (``[clients, batch, ...]``),
    outputs stacked the same way."""
    return unfold(call_at(module, params, (fold(x),)), x.shape[0])


def clients_per_fold(device: torch.device, positions: int) -> int | None:
    """How many clients to fold into one pass whose batches hold ``positions`` token positions each:
    on a CPU, as many as keep a pass near :data:`CPU_FOLD_POSITIONS`; elsewhere no bound (None)."""
    if device.type != "cpu":
        return None
    return max(1, CPU_FOLD_POSITIONS // max(positions, 1))


@dataclass(frozen=True)
class FoldedKernel:
    """The executor kernel of a step with clients folded into the batch. Same signature and contract as
    the ``vmap`` kernel: every client's loss, the gradients by one backward pass, the optimizer's
    in-place update."""

    step: Step

    def __call__(self, params, buffers, opt_state, x, y, weight, lr, keys):  # noqa: ARG002 - the signature
        loss = self.step.loss_fn
        leaves = grad_leaves(params)
        with torch.enable_grad():
            logits = call_at(loss.model, leaves, (fold(x),))
            per_sample = unfold(loss.criterion(logits, fold(y)), x.shape[0])
            losses = weighted_mean(per_sample, weight, dim=1)
            grads = leaf_gradients(losses.sum(), leaves)
        self.step.optimizer.update_(params, grads, opt_state, lr)
        return losses.detach()


def folded_kernel(step: Step) -> FoldedKernel | None:
    """The :class:`FoldedKernel` of ``step``, or None where the step is not the weighted-mean loss of a
    module that folds."""
    loss = step.loss_fn
    if not isinstance(loss, ClassificationLoss) or not folds_clients(loss.model):
        return None
    return FoldedKernel(step)
