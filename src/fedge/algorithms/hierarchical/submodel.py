"""Cell submodels as tensors: cut them out of the cloud model, mask them, and merge them back (Eq. 4, 7).

A :class:`CellViews` fixes, for one global round, where each cell's submodel sits in the full model: per
partitioned layer, the neuron ids each cell holds as an ``[N, w]`` index and which of those slots are
real. Two forms give the same numbers:

* ``compact``: a cell's ids are its own neurons, sorted, padded (by repeating one) to the widest cell;
  its tensors are narrow (``784 x s_j`` instead of ``784 x 300``), padding slots held at zero.
* ``masked``: every cell indexes all neurons and the slots of other cells' neurons are held at zero --
  the masked-full-model form ``p_j * x`` of Eq. 4-5.

Shared tensors are copied whole to every cell and averaged back (unweighted, as HIST's averages are, Eq. 1);
partitioned tensors are merged by writing each cell's real slots back to their neurons, i.e. the sum of the
disjoint masked submodels (Eq. 7). Merging untouched submodels gives back the model bit-exactly. Stacked
tensors carry a leading cell (or client) dimension throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from fedge.algorithms.hierarchical.masks import HiddenLayer
from fedge.tensors import Tensors

Form = Literal["compact", "masked"]
VALID = "hist.valid."  # per-client slot masks ride in the optimizer state under these names


def _row_factor(tensor: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``valid`` (``[..., w]``) as 0/1 factors over the slots of ``tensor`` (``[..., w, *rest]``)."""
    return valid.reshape(*valid.shape, *([1] * (tensor.dim() - valid.dim()))).to(tensor.dtype)


def _column_factor(tensor: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``valid`` (``[..., w]``) as 0/1 factors over the columns of ``tensor`` (``[..., out, w]``)."""
    return valid.unsqueeze(-2).to(tensor.dtype)


def mask_rows(tensor: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Zero the slots of ``tensor`` (``[..., w, *rest]``) where ``valid`` (``[..., w]``) is 0."""
    return tensor * _row_factor(tensor, valid)


def mask_columns(tensor: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Zero the columns of ``tensor`` (``[..., out, w]``) where ``valid`` (``[..., w]``) is 0."""
    return tensor * _column_factor(tensor, valid)


def apply_valid_(params: Tensors, layout: tuple[HiddenLayer, ...], valid: list[torch.Tensor]) -> None:
    """:func:`apply_valid` in place: the same products, written into ``params``' own tensors."""
    for layer, v in zip(layout, valid, strict=True):
        for name in layer.rows:
            params[name].mul_(_row_factor(params[name], v))
        params[layer.column].mul_(_column_factor(params[layer.column], v))


def apply_valid(params: Tensors, layout: tuple[HiddenLayer, ...], valid: list[torch.Tensor]) -> Tensors:
    """``params`` with every padded or foreign slot of every partitioned layer set to zero (no batch dim
    needed: works per client inside ``vmap`` and on stacked tensors alike)."""
    out = dict(params)
    for layer, v in zip(layout, valid, strict=True):
        for name in layer.rows:
            out[name] = mask_rows(out[name], v)
        out[layer.column] = mask_columns(out[layer.column], v)
    return out


@dataclass(frozen=True)
class CellViews:
    """Where each of ``num_cells`` cell submodels sits in the full model during one global round."""

    layout: tuple[HiddenLayer, ...]
    num_cells: int
    index: tuple[torch.Tensor, ...] = ()  # per layer [N, w] neuron ids (long)
    valid: tuple[torch.Tensor, ...] = ()  # per layer [N, w] bool: real slots
    roles: dict[str, tuple[int, str]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        layout: tuple[HiddenLayer, ...],
        owners: list[np.ndarray],
        num_cells: int,
        form: Form,
        device: torch.device | str = "cpu",
    ) -> CellViews:
        """Views of the partition given by ``owners`` (the owning cell of every neuron of every layer)."""
        index, valid = [], []
        for layer, owner in zip(layout, owners, strict=True):
            if form == "masked":
                ids = np.broadcast_to(np.arange(layer.width), (num_cells, layer.width))
                real = owner[None, :] == np.arange(num_cells)[:, None]
            else:
                counts = np.bincount(owner, minlength=num_cells)
                width = int(counts.max())
                ids = np.empty((num_cells, width), dtype=np.int64)
                for cell in range(num_cells):
                    mine = np.flatnonzero(owner == cell)  # may be empty in a further, narrower layer
                    ids[cell] = np.concatenate(
                        [mine, np.full(width - len(mine), mine[0] if len(mine) else 0)]
                    )
                real = np.arange(width)[None, :] < counts[:, None]
            index.append(torch.as_tensor(np.array(ids), dtype=torch.long, device=device))
            valid.append(torch.as_tensor(real, dtype=torch.bool, device=device))
        roles = {}
        for i, layer in enumerate(layout):
            roles.update({name: (i, "row") for name in layer.rows})
            roles[layer.column] = (i, "column")
        return cls(layout, num_cells, tuple(index), tuple(valid), roles)

    def gather(self, full: Tensors) -> Tensors:
        """Every cell's submodel of the full tensors ``full``, stacked ``[N, ...]`` (Eq. 4)."""
        return {name: self.cut(name, t) for name, t in full.items()}

    def cut(self, name: str, full: torch.Tensor, cell: int | None = None) -> torch.Tensor:
        """The part of full tensor ``name`` that cell ``cell`` holds (all cells stacked for ``None``),
        zero on padded or foreign slots."""
        role = self.roles.get(name)
        if role is None:
            return (
                full.clone()
                if cell is not None
                else full.unsqueeze(0).repeat(self.num_cells, *([1] * full.dim()))
            )
        index, valid = self.index[role[0]], self.valid[role[0]]
        if cell is not None:
            index, valid = index[cell], valid[cell]
        if role[1] == "row":
            return mask_rows(full[index], valid)
        columns = full[:, index]  # [out, N, w] or [out, w]
        return mask_columns(columns if cell is not None else columns.transpose(0, 1).contiguous(), valid)

    def merge(self, cells: Tensors, reduce: Callable[[Tensors], Tensors]) -> Tensors:
        """The cloud model from stacked cell submodels (Eq. 7): the shared tensors ``reduce``d over the
        cells (the cloud's aggregation pipeline: by default their mean), partitioned ones assembled from
        each cell's real slots (each neuron is held by exactly one cell)."""
        averaged = reduce({name: t for name, t in cells.items() if name not in self.roles})
        out = {}
        for name, t in cells.items():
            role = self.roles.get(name)
            if role is None:
                out[name] = averaged[name]
                continue
            layer, ids, real = self.layout[role[0]], self.index[role[0]], self.valid[role[0]]
            if role[1] == "row":
                merged = t.new_zeros(layer.width, *t.shape[2:])
                merged[ids[real]] = t[real]
            else:
                merged = t.new_zeros(t.shape[1], layer.width)
                merged[:, ids[real]] = t.transpose(0, 1)[:, real]
            out[name] = merged
        return out

    def client_valid(self, cell_of: torch.Tensor) -> Tensors:
        """Per-client slot masks (optimizer-state entries the masked step reads) of clients in ``cell_of``."""
        return {f"{VALID}{i}": v[cell_of].to(torch.float32) for i, v in enumerate(self.valid)}

    def real(self, cell: int, stacked: Tensors) -> Tensors:
        """The values cell ``cell``'s submodel really holds, from tensors stacked over its clients
        (``[n_j, ...]``): what a client uploads, or an edge sends."""
        out = {}
        for name, t in stacked.items():
            role = self.roles.get(name)
            if role is None:
                out[name] = t
            elif role[1] == "row":
                out[name] = t[:, self.valid[role[0]][cell]]
            else:
                out[name] = t[:, :, self.valid[role[0]][cell]]
        return out

    def placed(self, cell: int, stacked: Tensors, decoded: Tensors) -> Tensors:
        """``stacked`` (cell ``cell``'s tensors over some holders) with the values :meth:`real` took
        replaced by ``decoded`` (what was sent, as the receiver decodes it): the inverse of :meth:`real`."""
        out = dict(stacked)
        for name, value in decoded.items():
            role = self.roles.get(name)
            if role is None:
                out[name] = value
                continue
            placed, valid = stacked[name].clone(), self.valid[role[0]][cell]
            if role[1] == "row":
                placed[:, valid] = value
            else:
                placed[:, :, valid] = value
            out[name] = placed
        return out

    def values(self, full: Tensors) -> np.ndarray:
        """Number of values each cell's submodel holds (``d_j``; shared tensors count whole)."""
        total = np.zeros(self.num_cells, dtype=np.int64)
        for name, t in full.items():
            role = self.roles.get(name)
            if role is None:
                total += t.numel()
            else:
                count = self.valid[role[0]].sum(dim=1).cpu().numpy()
                total += count * (t.numel() // self.layout[role[0]].width)
        return total
