"""Computation latency and energy of local training, from counted FLOPs.

Neither paper of the wireless family gives a compute model (lightweight FedSL's Fig. 4 is about communication
only; CSE-FSL measures no time), so this is our completion, labelled as such: time = cycles / f with cycles =
FLOPs x cycles-per-FLOP, energy = kappa x f^2 x cycles (the usual CMOS model), backward pass = 2x forward.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

BACKWARD_FACTOR = 2.0  # FLOPs of a backward pass relative to the forward pass


def forward_flops(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs (multiply-adds x 2) of one forward pass of ``module`` on a single sample."""
    was_training = module.training
    module.eval()
    try:
        sample = torch.zeros(1, *input_shape, device=next(module.parameters()).device)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(sample)
    finally:
        module.train(was_training)
    return int(counter.get_total_flops())


def training_flops(forward_per_sample: float, samples: np.ndarray | float) -> np.ndarray:
    """FLOPs of forward + backward passes over ``samples`` samples."""
    return (1.0 + BACKWARD_FACTOR) * forward_per_sample * np.asarray(samples, dtype=np.float64)


def compute_seconds(
    flops: np.ndarray | float, cycles_per_flop: float, cpu_hz: np.ndarray | float
) -> np.ndarray:
    """Seconds to execute ``flops`` on a CPU at ``cpu_hz``."""
    return np.asarray(flops, dtype=np.float64) * cycles_per_flop / np.asarray(cpu_hz, dtype=np.float64)


def compute_energy(
    flops: np.ndarray | float, cycles_per_flop: float, cpu_hz: np.ndarray | float, kappa: float
) -> np.ndarray:
    """Joules of ``flops`` under the CMOS model ``kappa * f^2 * cycles``."""
    cycles = np.asarray(flops, dtype=np.float64) * cycles_per_flop
    return kappa * np.asarray(cpu_hz, dtype=np.float64) ** 2 * cycles
