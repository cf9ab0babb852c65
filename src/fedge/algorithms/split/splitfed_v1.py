"""SplitFed v1 (Thapa et al.), the CSE-FSL paper's FSL_MC baseline (its [6]).

Every participant has its own server-side copy. Per batch the client sends its smashed data and labels,
its copy takes one SGD step and returns the cut-layer gradient, and the client back-propagates it.
Copies are independent, so all clients (and copies) run in parallel on either executor; at each
aggregation the client models are averaged and so are the server copies (not stated in the
paper; docs/decisions.md, "Server copies averaged at aggregation").
"""

from __future__ import annotations

from typing import Literal

from fedge.algorithms.base import register
from fedge.algorithms.split.config import GradientReturnConfig, ServerCopiesConfig
from fedge.algorithms.split.copies import ServerCopies
from fedge.algorithms.split.protocol import GradientReturn
from fedge.algorithms.split.server import SplitServer
from fedge.tensors import Tensors


class SplitFedV1Config(GradientReturnConfig, ServerCopiesConfig):
    """FSL_MC: the shared split knobs, optional gradient clipping (off) and ``copies_eval``."""

    name: Literal["splitfed_v1"] = "splitfed_v1"
    """the algorithm (`fedge list`)"""


@register(
    "splitfed_v1",
    SplitFedV1Config,
    "SplitFed v1 (FSL_MC): a server copy per client, cut-layer gradients returned every batch",
)
class SplitFedV1(GradientReturn):
    """FSL_MC: clients back-propagate returned gradients; one server copy per participant."""

    cfg: SplitFedV1Config

    def server_part(self, params: Tensors, buffers: Tensors) -> SplitServer:
        cfg = self.cfg
        module = self.clients.parts.server
        return ServerCopies(
            module,
            params,
            buffers,
            self.server_sgd,
            cfg.clip_norm,
            self.ctx.executor,
            cfg.copies_eval,
            criterion=self.ctx.criterion,
            fused=self.ctx.config.engine.fused,
        )
