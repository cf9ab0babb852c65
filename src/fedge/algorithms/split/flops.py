"""FLOPs per sample of each part of a split model, counted once per run (backward = 2 x forward); the
system model turns them into time and energy."""

from __future__ import annotations

from dataclasses import dataclass

from fedge.algorithms.split.parts import SplitParts
from fedge.system import forward_flops


@dataclass(frozen=True)
class SplitFlops:
    """Forward FLOPs per sample of the client trunk, the aux head (0 without one) and the server part."""

    trunk: float
    aux: float
    server: float


def count_flops(parts: SplitParts) -> SplitFlops:
    """FLOPs per sample of each part of ``parts``."""
    aux = forward_flops(parts.local.aux, parts.smashed_shape) if parts.has_aux else 0
    return SplitFlops(
        trunk=forward_flops(parts.trunk, parts.input_shape),
        aux=aux,
        server=forward_flops(parts.server, parts.smashed_shape),
    )
