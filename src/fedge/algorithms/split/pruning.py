"""Client-side unstructured pruning of lightweight FedSL (Eqs. 8-10, Algorithm 1 lines 13-17).

Pure functions on dicts of tensors: the cubic sparsity schedule of Zhu & Gupta, the set of prunable tensors
(conv and linear weights of the client part, GPT-2's ``Conv1D`` projections among them; biases, BatchNorm
affine parameters and buffers are never pruned, our choice: the paper does not discuss them; on a LoRA
transformer the adapters ``A`` and ``B`` of the client part, its only trained weights, the frozen base being
no client state), the first-order Taylor importance ``|w * g|`` ranked globally
over all prunable weights, and the realised sparsity (exact zeros over prunable weights).
"""

from __future__ import annotations

import torch
from torch import nn

from fedge.models.lora import ADAPTERS, LoRALinear, is_projection
from fedge.tensors import Tensors

PRUNABLE_LAYERS = (nn.modules.conv._ConvNd, nn.Linear)


def sparsity_target(t: int, total: int, rho_final: float) -> float:
    """``rho_t = rho_f * (1 - (1 - t/T)^3)`` (Eq. 10): rises steeply from 0 and flattens at ``rho_f``.

    Rounds past ``total`` keep the final value (the schedule's T may be shorter than the run).
    """
    progress = min(t, total) / total
    return rho_final * (1.0 - (1.0 - progress) ** 3)


def _trained_projection(layer: nn.Module) -> bool:
    """A conv or linear layer (GPT-2's ``Conv1D`` too) whose weight trains: a frozen one's weight is a
    plain tensor, no parameter (``fedge.models.lora.freeze``)."""
    projection = isinstance(layer, PRUNABLE_LAYERS) or is_projection(layer)[0]
    return projection and "weight" in layer._parameters


def prunable_names(module: nn.Module, prefix: str = "") -> list[str]:
    """State names (with ``prefix``) of the trained conv and linear weights of ``module`` and the adapters
    of its LoRA projections (``lora_A``, ``lora_B``), in module order."""
    names = []
    for name, layer in module.named_modules():
        path = f"{prefix}{name}." if name else prefix
        if isinstance(layer, LoRALinear):
            names += [f"{path}{adapter}" for adapter in ADAPTERS]
        elif _trained_projection(layer):
            names.append(f"{path}weight")
    return names


def _flat(tensors: Tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def _unflat(flat: torch.Tensor, like: Tensors) -> Tensors:
    out, start = {}, 0
    for name, t in like.items():
        out[name] = flat[start : start + t.numel()].reshape(t.shape)
        start += t.numel()
    return out


def sparsity(weights: Tensors) -> float:
    """Fraction of exactly-zero entries over all tensors of ``weights`` (the trigger's measure)."""
    flat = _flat(weights)
    return float((flat == 0).sum()) / max(flat.numel(), 1)


def importance_mask(weights: Tensors, grads: Tensors, count: int) -> Tensors:
    """0/1 masks zeroing the ``count`` least important weights, importance ``|w * g|`` ranked globally.

    Ties are broken by a stable sort in state order. Weights that are already exactly zero rank below
    every other weight, so they are pruned first even where some non-zero weight also scores 0 (a dead
    unit): masks stay nested between aggregations, as the paper's Lemma 2 assumes, and a pruned weight
    is never revived by a later, larger mask.
    """
    w, g = _flat(weights), _flat({name: grads[name] for name in weights})
    scores = torch.where(w == 0, torch.full_like(w, -1.0), (w * g).abs())
    order = torch.argsort(scores, stable=True)
    keep = torch.ones_like(w)
    keep[order[:count]] = 0.0
    return _unflat(keep, weights)
