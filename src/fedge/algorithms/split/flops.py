"""FLOPs per sample of each part of a split model, counted once per run (backward = 2 x forward); the
system model turns them into time and energy."""

from __future__ import annotations

from dataclasses import dataclass

from fedge.algorithms.split.parts import SplitParts
from fedge.system import forward_flops, training_flops
from fedge.system.compute import BACKWARD_FACTOR


@dataclass(frozen=True)
class SplitFlops:
    """Forward FLOPs per sample of the client trunk, the aux head (0 without one) and the server part."""

    trunk: float
    aux: float
    server: float


def count_flops(parts: SplitParts) -> SplitFlops:
    """FLOPs per sample of each part of ``parts``."""
    aux = forward_flops(parts.aux, parts.smashed_shape) if parts.has_aux else 0
    return SplitFlops(
        trunk=forward_flops(parts.trunk, parts.input_shape),
        aux=aux,
        server=forward_flops(parts.server, parts.smashed_shape),
    )


def alignment_flops(flops: SplitFlops, samples: int, epochs: int) -> float:
    """FLOPs of one FSL-SAGE alignment on ``samples`` stored samples: the server's forward pass and
    backward pass to its input on each (its true cut-layer gradients: a training pass), then ``epochs``
    passes of the gradient-matching loss, each a forward and backward pass of the aux model (its estimate)
    differentiated once more in the aux weights: by the clock's rule that backward costs twice the pass
    it differentiates, so (1 + 2) training passes of the aux model per sample and epoch."""
    true = training_flops(flops.server, samples)
    fit = (1.0 + BACKWARD_FACTOR) * training_flops(flops.aux, samples * epochs)
    return float(true + fit)
