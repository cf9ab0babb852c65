"""LoRA adapters over a frozen base held once: the trainable state of a transformer fine-tuned by fedge.

A LoRA projection (Hu et al., 2022) computes ``y = base(x) + (alpha / r) * dropout(x) A^T B^T`` with a
frozen base projection ``W`` and two small trained matrices, ``A`` (``r x in``, Kaiming-uniform) and ``B``
(``out x r``, zero, so training starts from the base model). Only ``A`` and ``B`` are parameters of the
module; the base weight and bias are plain tensor attributes (:func:`freeze`), so
:func:`~fedge.engine.parameters_of` yields the adapters alone and everything fedge stacks per client (the
client bank, the optimizer state, every upload and average) is adapter-sized, while the base exists once
per process whatever the number of clients.

Why fedge writes this layer instead of wrapping the model with ``peft``: ``peft`` keeps one set of
adapters per module as ``nn.Parameter`` s next to a base weight that is itself a (frozen) parameter, so the
functional view of the model would carry the base with every client, and it trains one adapter set at a
time. fedge's batched executor needs the opposite: the adapters as explicit stacked tensors
``[clients, r, in]`` and the base shared. With the clients' batches folded into one (:meth:`_folded`)
this layer is the stacked-adapter kernel: the frozen projection ``x W^T`` (``W`` not batched) runs as
one matrix product over every client's tokens, and the low-rank term as two batched products, one per
client: ``(alpha / r) * bmm(x, A^T)`` (the scaling on the rank-``r`` intermediate, a pass over ``r``
columns instead of ``out``; the same numbers as scaling the update when ``alpha / r`` is a power of two,
as the default 16 / 8 is, and a rounding apart otherwise), whose product with ``B^T`` is accumulated
into the projection's output in place (``baddbmm_``: no separate pass to scale or add the update,
forward or backward). Under ``torch.func.vmap`` over stacked adapters, and in the sequential executor on
one client's ``[r, in]`` adapters, the layer computes the same sum, the update added to the projection
with ``add_``. ``peft`` stays the way a researcher writes the per-client loop (``benchmarks/llm.py`` uses
it as that baseline); its module naming (``lora_A``, ``lora_B``, ``r``, ``lora_alpha``,
``target_modules``) is kept here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

ADAPTERS = ("lora_A", "lora_B")  # the parameter names of an adapter


class LoRALinear(nn.Module):
    """A frozen projection plus a trained rank-``r`` update.

    ``weight`` is ``[out, in]`` (``nn.Linear``'s layout) or ``[in, out]`` with ``transposed`` (GPT-2's
    ``Conv1D``); ``bias`` may be None. Both are held as plain tensors, not parameters.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        transposed: bool = False,
    ):
        super().__init__()
        in_features, out_features = weight.shape if transposed else weight.shape[::-1]
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.scaling = alpha / rank
        self.transposed = transposed
        self.weight = weight.detach()  # plain tensors: the frozen base, never stacked per client
        self.bias = None if bias is None else bias.detach()
        dtype, device = weight.dtype, weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, in_features, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, dtype=dtype, device=device))
        if self.lora_A.device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # peft's and the LoRA paper's init
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def base(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen projection alone (a new tensor: the adapters' update is added to it in place)."""
        if self.transposed:
            out = x @ self.weight
            return out if self.bias is None else out.add_(self.bias)
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora_A.dim() == 3:
            return self._folded(x)
        low = (self.dropout(x) @ self.lora_A.transpose(0, 1)) * self.scaling
        return self.base(x).add_(low @ self.lora_B.transpose(0, 1))  # add_: vmap has no addmm_ rule

    def _folded(self, x: torch.Tensor) -> torch.Tensor:
        """Several clients' batches folded into one: ``x`` holds ``clients`` equal runs of rows (client
        after client), the adapters are stacked ``[clients, r, in]`` and ``[clients, out, r]``. The
        frozen projection runs once over every row; the update is one batched product per client, added
        into the projection's output by the product itself."""
        rows = x.reshape(self.lora_A.shape[0], -1, self.in_features)
        low = torch.bmm(self.dropout(rows), self.lora_A.transpose(1, 2)) * self.scaling
        out = self.base(rows).baddbmm_(low, self.lora_B.transpose(1, 2))
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, r={self.rank}, scaling={self.scaling:g}"


def adapters_only(module: nn.Module) -> bool:
    """Whether every parameter of ``module`` is a LoRA adapter: what a block needs to fold clients into
    one batch (:mod:`fedge.engine.folded`), since only :class:`LoRALinear` reads stacked rows."""
    return all(isinstance(m, LoRALinear) or next(m.parameters(False), None) is None for m in module.modules())


class FoldsClients:
    """A block that computes every sample on its own (no batch statistics, nothing mixed across
    samples): clients fold into one batch of it (:mod:`fedge.engine.folded`) when it trains adapters only."""

    @property
    def folds_clients(self) -> bool:
        return adapters_only(self)


def is_projection(module: nn.Module) -> tuple[bool, bool]:
    """Whether ``module`` is a projection LoRA can wrap, and whether its weight is ``[in, out]``."""
    if isinstance(module, nn.Linear):
        return True, False
    if type(module).__name__ == "Conv1D" and hasattr(module, "nf"):  # transformers' GPT-2 projection
        return True, True
    return False, False


def add_adapters(
    model: nn.Module, targets: Iterable[str], rank: int, alpha: float, dropout: float
) -> list[str]:
    """Replace every projection whose own name is in ``targets`` by a :class:`LoRALinear` over it; the
    full names of the replaced modules (empty when nothing matched)."""
    wanted = set(targets)
    replaced = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            ok, transposed = is_projection(child)
            if ok and name in wanted:
                lora = LoRALinear(child.weight, child.bias, rank, alpha, dropout, transposed)
                setattr(parent, name, lora)
                replaced.append(f"{parent_name}.{name}" if parent_name else name)
    return replaced


def freeze(model: nn.Module, parameters: bool = True) -> list[tuple[nn.Module, str]]:
    """Turn every buffer and (with ``parameters``) every parameter but the adapters into a plain tensor
    attribute of its module: out of the functional state (held once per process), still read by the
    module's forward. Returns the ``(module, name)`` slots made, so that a model can move them with
    itself. Tied weights (GPT-2's embedding and head) stay one tensor."""
    slots = []
    plain: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, LoRALinear):  # its base is plain already: listed so that it moves too
            slots += [(module, name) for name in ("weight", "bias") if getattr(module, name) is not None]
        for table, is_param in ((module._parameters, True), (module._buffers, False)):
            for name in list(table):
                value = table[name]
                if value is None or (is_param and (not parameters or name in ADAPTERS)):
                    continue
                del table[name]
                object.__setattr__(module, name, plain.setdefault(id(value), value.detach()))
                slots.append((module, name))
    return slots
