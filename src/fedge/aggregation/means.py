"""The built-in reducers: the means each aggregation site has always taken.

``mean`` is the site's own mean: the weighted mean (:class:`WeightedMean`) at a server, a peer and an
asynchronous buffer, each edge server's mean of its own cell's clients (:class:`BlockMean`), and HIST's
unweighted cloud average of the cells' shared tensors written ``x_0 + mean(x - x_0)``
(:class:`AnchoredMean`, so that cells that agree average to themselves bit-exactly).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fedge.aggregation.stage import Reducer
from fedge.aggregation.updates import Updates
from fedge.tensors import Tensors


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


class WeightedMean(Reducer):
    """``sum_r w[r] * row[r]`` per output, one matrix product per tensor and part (the parts' products
    added in order), so no temporary as large as the stacked rows.

    Integer tensors (counters) take the largest row's value for one output and are left to the
    receivers' own values for one output per receiver. The weights are the site's (sample counts at a
    FedAvg server, a mixing matrix between peers); this reducer does not renormalise them. A masked
    tensor (see :class:`~fedge.aggregation.updates.Part`) is averaged per coordinate over the rows that
    hold it (:func:`masked_mean`).
    """

    additive: ClassVar[bool] = True

    def reduce(self, updates: Updates) -> Tensors:
        out: Tensors = {}
        for name, first in updates.parts[0].rows.items():
            if not first.is_floating_point():
                if not updates.per_receiver:
                    out[name] = torch.cat([part.rows[name] for part in updates.parts]).max(dim=0).values
                continue
            if name in updates.parts[0].masks:
                out[name] = masked_mean(updates, name)
                continue
            total: torch.Tensor | None = None
            for part in updates.parts:
                t = part.rows[name]
                w = part.weights.to(device=t.device, dtype=t.dtype)
                term = w @ _flat(t)
                total = term if total is None else total + term
            assert total is not None
            shape = (*total.shape[:-1], *first.shape[1:])
            out[name] = total.reshape(shape)
        return out


def masked_mean(updates: Updates, name: str) -> torch.Tensor:
    """Coordinate-wise ``sum_r w[r] m[r] x[r] / sum_r w[r] m[r]`` of tensor ``name`` over the rows whose
    mask ``m`` holds the coordinate (Dis-PFL's masked averaging, the parts' products added in order);
    where no weighted row holds it, the site's own value (``updates.reference``)."""
    first = updates.parts[0].rows[name]
    numerator: torch.Tensor | None = None
    denominator: torch.Tensor | None = None
    for part in updates.parts:
        x = part.rows[name]
        w = part.weights.to(device=x.device, dtype=x.dtype)
        m = part.masks[name].to(x.dtype)
        num, den = w @ _flat(m * x), w @ _flat(m)
        numerator = num if numerator is None else numerator + num
        denominator = den if denominator is None else denominator + den
    assert numerator is not None and denominator is not None
    if updates.reference is None or name not in updates.reference:
        raise ValueError(f"the {updates.site} has no own value of {name!r} for coordinates no row holds")
    fallback = _flat(updates.reference[name]).reshape(numerator.shape)
    tiny = torch.finfo(first.dtype).tiny
    value = torch.where(denominator > 0, numerator / denominator.clamp_min(tiny), fallback)
    return value.reshape(*numerator.shape[:-1], *first.shape[1:])


class AnchoredMean(Reducer):
    """The unweighted mean over the rows, written ``x_0 + mean(x - x_0)`` so that identical rows average
    to themselves bit-exactly (HIST's cloud, Eq. 7); integer tensors take the maximum. One output."""

    def reduce(self, updates: Updates) -> Tensors:
        if updates.per_receiver:
            raise ValueError("the anchored mean has one output; this site has one per receiver")
        out: Tensors = {}
        for name, t in updates.joined().rows.items():
            out[name] = t.max(dim=0).values if not t.is_floating_point() else t[0] + (t - t[0]).mean(dim=0)
        return out


class BlockMean(Reducer):
    """One output per receiver, each the unweighted mean of its own block of rows (an edge server's mean
    of its cell's clients, HIST Eq. 6): the weights give each receiver's ``n`` rows ``1/n`` and every other
    row zero, blocks of equal size in receiver order. Integer tensors take the block's maximum.

    With every block's rows present the mean is taken over each block of the reshaped rows; with a
    process's share of them (``additive``: the shares are added up over the processes) each receiver gets
    the sum of its rows here divided by its block's size, and integers the maximum of its rows here (the
    lowest integer where it has none).
    """

    additive: ClassVar[bool] = True

    def reduce(self, updates: Updates) -> Tensors:
        if not updates.per_receiver:
            raise ValueError("the block mean has one output per receiver; this site has one output")
        part = updates.joined()
        receivers = part.weights.shape[0]
        block_of = part.weights.argmax(dim=0)
        size = round(1.0 / float(part.weights.max()))
        ordered = torch.arange(receivers, device=block_of.device).repeat_interleave(size)
        whole = len(block_of) == len(ordered) and bool((block_of == ordered).all())
        out: Tensors = {}
        for name, t in part.rows.items():
            if whole:
                grouped = t.reshape(receivers, size, *t.shape[1:])
                out[name] = grouped.mean(dim=1) if t.is_floating_point() else grouped.max(dim=1).values
            else:
                out[name] = _block_share(t, block_of.to(t.device), receivers, size)
        return out


def _block_share(t: torch.Tensor, block_of: torch.Tensor, receivers: int, size: int) -> torch.Tensor:
    """Each receiver's share of its block mean from some of its rows: their sum over the block's
    ``size`` (integers: their maximum, the lowest integer where a block has no row here)."""
    shape = (receivers, *t.shape[1:])
    if t.is_floating_point():
        return torch.zeros(shape, dtype=t.dtype, device=t.device).index_add_(0, block_of, t) / size
    low = torch.full(shape, torch.iinfo(t.dtype).min, dtype=t.dtype, device=t.device)
    return low.index_reduce_(0, block_of, t, "amax")
