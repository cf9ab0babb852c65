"""The two kinds of split client, each a base of its algorithms: SplitFed's clients back-propagate the
cut-layer gradients the server returns (v1, v2); aux-head clients learn from a local loss and get nothing
back (FSL_AN, CSE-FSL)."""

from __future__ import annotations

from fedge.algorithms.split.clients import AuxHeadClients, ClientSide, GradientClients
from fedge.algorithms.split.config import AuxHeadConfig, GradientReturnConfig
from fedge.algorithms.split.parts import build_parts
from fedge.algorithms.split.protocol import SplitLearning


class GradientReturn(SplitLearning):
    """SplitFed's clients (v1 and v2): cut-layer gradients come back and are back-propagated."""

    cfg: GradientReturnConfig

    def client_side(self) -> ClientSide:
        parts = build_parts(self.ctx, with_aux=False)
        return GradientClients(parts, self.client_sgd, self.ctx.executor, self.cfg.clip_norm)


class LocalLoss(SplitLearning):
    """Aux-head clients (FSL_AN, CSE-FSL): they learn from their local loss; nothing comes back."""

    cfg: AuxHeadConfig

    def client_side(self) -> ClientSide:
        cfg, parts = self.cfg, build_parts(self.ctx, with_aux=True)
        post_step = cfg.smashed_from == "post_step"
        return AuxHeadClients(parts, self.client_sgd, self.ctx.executor, post_step, cfg.aggregate_aux)
