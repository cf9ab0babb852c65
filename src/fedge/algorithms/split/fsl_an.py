"""FSL_AN (Han et al., 2021): split learning with a client-side auxiliary network (CSE-FSL's [9] baseline).

Clients train trunk + aux head on the local loss and send the smashed data of every batch; nothing comes back.
The server keeps one copy per participant, each taking one SGD step per batch of its client; the copies are
averaged at each aggregation, like the client models (the paper leaves this open; docs/decisions.md, "Server
copies averaged at aggregation").
"""

from __future__ import annotations

from typing import Literal

from fedge.algorithms.base import register
from fedge.algorithms.split.config import AuxHeadConfig, ServerCopiesConfig
from fedge.algorithms.split.copies import ServerCopies
from fedge.algorithms.split.protocol import LocalLoss
from fedge.algorithms.split.server import SplitServer
from fedge.tensors import Tensors


class FslAnConfig(AuxHeadConfig, ServerCopiesConfig):
    """FSL_AN: the shared split knobs, ``smashed_from`` and ``copies_eval``."""

    name: Literal["fsl_an"] = "fsl_an"
    """the algorithm (`fedge list`)"""


@register(
    "fsl_an",
    FslAnConfig,
    "FSL_AN: client aux head (local loss), a server copy per client, smashed data every batch",
)
class FslAn(LocalLoss):
    """FSL_AN: aux head on every client, one server copy per participant."""

    cfg: FslAnConfig

    def server_part(self, params: Tensors, buffers: Tensors) -> SplitServer:
        module, cfg = self.clients.parts.server, self.cfg
        return ServerCopies(
            module,
            params,
            buffers,
            self.server_sgd,
            None,
            self.ctx.executor,
            cfg.copies_eval,
            criterion=self.ctx.criterion,
            fused=self.ctx.config.engine.fused,
        )
