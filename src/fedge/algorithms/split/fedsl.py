"""Traditional FedSL, lightweight FedSL's one named baseline (its Sec. IV).

The same code path as :mod:`~fedge.algorithms.split.light_fedsl` with every compression off: no pruning
(rho_f = 0), full-precision client gradients, no cut dropout (p = 0) and client aggregation every round
(I = 1). Its config therefore has only the shared knobs; ``fedge compare`` drops the compression keys.
"""

from __future__ import annotations

from typing import Literal

from fedge.algorithms.base import register
from fedge.algorithms.split.light_fedsl import Compression, FedSLConfig, FedSLRounds


class TraditionalFedSLConfig(FedSLConfig):
    """Traditional FedSL: batch size, step size, initialisation and codecs only."""

    name: Literal["fedsl"] = "fedsl"
    """the algorithm (`fedge list`)"""


@register(
    "fedsl",
    TraditionalFedSLConfig,
    "Traditional FedSL: lightweight FedSL's baseline (no pruning, quantization or dropout; I = 1)",
)
class FedSL(FedSLRounds):
    """Lightweight FedSL's round with rho_f = 0, q = None, p = 0, I = 1."""

    def compression(self) -> Compression:
        return Compression(0.0, self.ctx.config.rounds, None, "vector", 0.0, 1)
