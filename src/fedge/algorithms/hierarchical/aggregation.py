"""An edge server's aggregation of its clients' uploads: their mean (OMA) or its over-the-air estimate.

AirComp's estimate is the exact client mean minus the learning rate times the channel's effective
noise, drawn per coordinate of the full model and cut like the cell's submodel (HIST Eqs. 25-27).
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.algorithms.base import Context
from fedge.algorithms.hierarchical.cells import Cells
from fedge.algorithms.hierarchical.config import HierarchicalConfig
from fedge.algorithms.hierarchical.radio import CellRadio
from fedge.algorithms.hierarchical.submodel import CellViews, Tensors
from fedge.distributed import Cohort
from fedge.rng import torch_rng


class EdgeAggregation:
    """The edge servers' aggregation of :class:`~fedge.algorithms.hierarchical.hierarchy.HierarchicalFL`
    (a mixin: it reads the host's cells, radio and global model)."""

    cfg: HierarchicalConfig
    ctx: Context
    cells: Cells
    radio: CellRadio
    params: Tensors

    def _mean(
        self, t: int, e: int, views: CellViews, clients: Cohort, uploaded: Tensors, uploaded_buffers: Tensors
    ) -> tuple[Tensors, Tensors, list[float]]:
        """Each edge server's new model: its clients' mean (OMA), or its over-the-air estimate (AirComp,
        with each cell's per-element MSE)."""
        means = clients.block_mean(uploaded | uploaded_buffers, self.cells.num_cells)
        new_params, new_buffers = {k: means[k] for k in uploaded}, {k: means[k] for k in uploaded_buffers}
        mses = self._over_the_air(t, e, views, new_params) if self.cfg.aggregation == "aircomp" else []
        return new_params, new_buffers, mses

    def _over_the_air(self, t: int, e: int, views: CellViews, cell_params: Tensors) -> list[float]:
        """Turn each cell's exact client mean into its AirComp estimate (Eq. 26-27), in place.

        The edge model is ``x_j - gamma (mean_i delta_i + Z_j)`` = client mean ``- gamma Z_j``, ``Z_j`` i.i.d.
        real Gaussian on the values the cell holds with the Eq. 25 MSE as variance (``noise_model="paper"``,
        docs/decisions.md, "Real AirComp noise") or half of it (``"real_part"``). Noise is drawn per
        coordinate of the full model and cut like the submodel, so both forms see the same noise. Returns each
        cell's per-element MSE.
        """
        radio, lr = self.cfg.radio, self.cfg.optimizer.lr
        mses = []
        for j in range(self.cells.num_cells):
            mse = self.radio.aircomp_mse(t, e, j)
            std = float(np.sqrt(mse / 2 if radio.noise_model == "real_part" else mse))
            gen = torch_rng(self.ctx.seed, "hist-aircomp-noise", t, e, j, device=self.ctx.device)
            for name, value in cell_params.items():
                full = self.params[name]
                noise = torch.randn(full.shape, generator=gen, device=full.device, dtype=full.dtype)
                value[j] -= lr * std * views.cut(name, noise, j)
            mses.append(mse)
        return mses
