"""SplitFed v2 (Thapa et al.), the CSE-FSL paper's FSL_OC baseline with gradient clipping (its [6]).

One server model is updated sequentially by every client's batches, in ``server_order`` (default
round-robin per batch, CSE-FSL's block schedule with h = 1; ``client_after_client`` is the SplitFed
paper's own order), and returns the cut-layer gradient of each batch. The paper found this baseline
unstable and clipped gradients; the threshold is unstated, so we clip the global L2 norm of the server
gradient and of each client's gradient at ``clip_norm`` = 1.0 (``null`` turns it off; CSE-FSL Sec. VI-A).
"""

from __future__ import annotations

import math
from typing import Literal

from fedge.algorithms.base import register
from fedge.algorithms.split.config import GradientReturnConfig, Positive
from fedge.algorithms.split.protocol import GradientReturn
from fedge.algorithms.split.server import SharedServer, SplitServer
from fedge.tensors import Tensors


class SplitFedV2Config(GradientReturnConfig):
    """FSL_OC: the shared split knobs and gradient clipping at 1.0 by default."""

    name: Literal["splitfed_v2"] = "splitfed_v2"
    """the algorithm (`fedge list`)"""
    clip_norm: Positive | None = 1.0
    """global-norm clipping of server and client gradients"""


@register(
    "splitfed_v2",
    SplitFedV2Config,
    "SplitFed v2 (FSL_OC): one server model updated client after client, gradients returned, clipping",
)
class SplitFedV2(GradientReturn):
    """FSL_OC: clients back-propagate returned gradients; one shared server model."""

    cfg: SplitFedV2Config
    lm_batched_from = math.inf
    """On a CPU a transformer's SplitFed v2 round is mostly the shared server's steps, one client after
    another on either executor; the batched client side gains nothing on a dense base and its vmap
    costs more than it saves (docs/llm.md, W9): the sequential executor."""

    def server_part(self, params: Tensors, buffers: Tensors) -> SplitServer:
        parts, clip = self.clients.parts, self.cfg.clip_norm
        fused = self.ctx.config.engine.fused
        return SharedServer(parts.server, params, buffers, self.server_sgd, clip, self.ctx.criterion, fused)
