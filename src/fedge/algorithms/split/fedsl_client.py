"""Lightweight FedSL's client side: the cut-layer dropout masks (Eq. 3) and the client update, which
prunes, masks, quantizes and steps (Eqs. 8-13).

Each works on the rows of the clients this process runs (the run's fixed cohort), row ``i`` being
client ``first + i``, and draws from streams named by the client, so every process draws what one
process would.
"""

from __future__ import annotations

import torch

from fedge.algorithms.split.fedsl_config import Compression
from fedge.algorithms.split.pruning import importance_mask, sparsity
from fedge.comm import dropout_mask
from fedge.comm.quantize import quantize_dict
from fedge.rng import torch_rng
from fedge.tensors import Tensors


def cut_masks(seed: int, t: int, counts: torch.Tensor, z: torch.Tensor, first: int, p: float) -> torch.Tensor:
    """0/1 keep masks of the cut-layer entries, ``[K, batch, ...]``, from each client's shared stream
    ``(seed, "cut-dropout", t, k)``; row i is client ``first + i``.

    Drawn per client on its real rows (padding rows stay 0), so both executors use the same masks.
    """
    keep = torch.zeros_like(z)
    for i, count in enumerate(counts.tolist()):
        if count:
            gen = torch_rng(seed, "cut-dropout", t, first + i, device=z.device)
            keep[i, :count] = dropout_mask((count, *z.shape[2:]), p, gen, device=z.device).to(z)
    return keep


class ClientUpdate:
    """Prune where the sparsity is below ``rho``, mask, quantize and take the SGD step (Eqs. 8-13) for
    the clients ``first, first + 1, ...`` whose rows a call holds.

    The importance uses this round's gradient at the unpruned weights (pruning follows the backward
    pass). A client that does not prune keeps its mask, so its pruned weights stay zero.
    """

    def __init__(self, knobs: Compression, prunable: list[str], seed: int, device: torch.device):
        self.knobs, self.prunable, self.seed, self.device = knobs, prunable, seed, device

    def __call__(
        self, t: int, rho: float, params: Tensors, grads: Tensors, masks: Tensors, lr: float, first: int
    ) -> tuple[Tensors, Tensors]:
        """The rows' new parameters and masks (``masks``: their current ones, not changed)."""
        masks = {name: mask.clone() for name, mask in masks.items()}
        rows = len(next(iter(params.values())))
        if rho > 0:
            self._prune(rho, params, grads, masks, rows)
        params, grads = dict(params), dict(grads)
        for name, mask in masks.items():
            params[name] = params[name] * mask.to(params[name])
            grads[name] = grads[name] * mask.to(grads[name])
        if self.knobs.quant_bits is not None:
            grads = self._quantized(t, grads, first, rows, self.knobs.quant_bits)
        return {name: p - lr * grads[name] for name, p in params.items()}, masks

    def _prune(self, rho: float, params: Tensors, grads: Tensors, masks: Tensors, rows: int) -> None:
        """Rows below sparsity ``rho`` get a fresh mask of their ``round(rho N)`` least important weights."""
        count = round(rho * sum(params[name][0].numel() for name in self.prunable))
        for k in range(rows):
            weights = {name: params[name][k] for name in self.prunable}
            if sparsity(weights) < rho:
                fresh = importance_mask(weights, {name: grads[name][k] for name in self.prunable}, count)
                for name, mask in fresh.items():
                    masks[name][k] = mask.bool()

    def _quantized(self, t: int, grads: Tensors, first: int, rows: int, bits: int) -> Tensors:
        """Each row's gradient stochastically quantized to ``bits`` from the stream
        ``(seed, "client-quantizer", t, k)``."""
        knobs = self.knobs
        quantized = [
            quantize_dict(
                {name: g[k] for name, g in grads.items()},
                bits,
                torch_rng(self.seed, "client-quantizer", t, first + k, device=self.device),
                knobs.quant_granularity,
            )
            for k in range(rows)
        ]
        return {name: torch.stack([r[name] for r in quantized]) for name in grads}
