"""ClippedGossip (He, Karimireddy and Jaggi, "Byzantine-robust decentralized learning via ClippedGossip",
2022): each peer moves from its own model towards its neighbours' by clipped differences.

Receiver i's new model is ``x_i + sum_j w_ij clip(x_j - x_i, tau_i)`` (the paper's self-centred
clipping, Eq. 3), ``clip(z, tau) = min(1, tau / ||z||) z`` over every floating tensor of a row as one
vector, with ``w_ij`` the peer's mixing weights (its own row at distance 0 included): a Byzantine
neighbour moves i by at most ``w_ij tau_i``. ``tau`` is a fixed radius, or ``auto``: the paper's
adaptive rule, which picks ``tau_i`` so that the neighbours clipped carry at most the weight ``delta``
that Byzantine neighbours may hold; read here as the weighted ``(1 - delta)``-quantile of receiver i's
distances ``||x_j - x_i||`` (sorted ascending, the first distance where the cumulated weight reaches
``1 - delta``), so the rows further than ``tau_i`` weigh at most ``delta``. ``tau = inf`` (or
``delta = 0`` under ``auto``) is plain gossip mixing.

A peer-site reducer only (one output per receiver, each centred on its own row): refused elsewhere.
Every receiver's rows are reduced at once, grouped by their count (:class:`RobustReducer`); its reports'
``kept`` is each row's clip factor. Cost per output: ``3 k d`` for the distances and ``3 k d`` for the
clipped sum.
"""

from __future__ import annotations

import torch

from fedge.aggregation import sites
from fedge.aggregation.robust import Batch, RobustReducer
from fedge.aggregation.stage import OptionError, StageRun
from fedge.errors import ConfigError
from fedge.tensors import Tensors

AUTO = "auto"


class ClippedGossip(RobustReducer):
    """Self-centred clipping at peers (see the module): ``tau`` a positive radius (``inf`` allowed) or
    ``auto`` (default), ``delta`` the Byzantine weight share the adaptive radius allows (0.2)."""

    name = "clipped_gossip"
    uses_reference = True

    def __init__(self, tau: float | str = AUTO, delta: float = 0.2):
        super().__init__()
        positive = isinstance(tau, int | float) and not isinstance(tau, bool) and tau > 0
        if not (tau == AUTO or positive):
            raise OptionError("tau", f"{tau!r} must be a positive number or {AUTO!r}")
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
            raise OptionError("delta", f"{delta!r} must be a number in [0, 1)")
        self.tau = None if tau == AUTO else float(tau)
        self.delta = float(delta)

    def bind(self, run: StageRun) -> None:
        if run.site != sites.PEER:
            raise ConfigError(
                f"{run.key}.at", f"clipped_gossip centres on each peer's own model; set at: [{sites.PEER}]"
            )
        super().bind(run)

    def radius(self, distance: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each output's ``tau_i`` ``[g]``: the fixed radius, or the weighted ``(1 - delta)``-quantile of
        its rows' ``distance`` ``[g, k]`` under ``weights`` ``[g, k]`` (each row summing to 1)."""
        if self.tau is not None:
            return torch.full(distance.shape[:1], self.tau, dtype=torch.float64)
        ordered, order = distance.sort(dim=1)
        reached = torch.gather(weights, 1, order).cumsum(dim=1)
        first = (reached < 1.0 - self.delta - 1e-12).sum(dim=1, keepdim=True)
        return torch.gather(ordered, 1, first.clamp_max(distance.shape[1] - 1))[:, 0]

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        if centre is None:
            raise ValueError("clipped_gossip needs each receiver's own row")
        g, k = batch.shape
        squared = torch.zeros(g, k, dtype=torch.float64)
        for name, cols, x in batch.blocks():
            gap = x - centre[name][:, cols].to(x.device)[:, None]
            squared += torch.linalg.vector_norm(gap, dim=2).double().square().cpu()
        distance = squared.sqrt()
        weights = batch.weights.double().cpu()
        tau = self.radius(distance, weights)
        factor = (tau[:, None] / distance.clamp_min(1e-300)).clamp_max(1.0)
        move = weights * factor
        for name, cols, x in batch.blocks():
            base = centre[name][:, cols].to(x.device)
            a = move.to(device=x.device, dtype=x.dtype)[:, None, :]
            out[name][:, cols] = base + (a @ (x - base[:, None]))[:, 0]
        return factor, [{"flops": float(6 * k * batch.dims)}] * g
