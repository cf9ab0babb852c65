"""The frozen base in the storage meter: every device holds the frozen tensors of its part of a
transformer once, whatever number of adapter copies it keeps beside them (SplitFed v1's server copies
included: the copies are adapters over the one base)."""

from __future__ import annotations

from torch import nn

from fedge.comm import Network
from fedge.comm.link import FP32_BITS
from fedge.models.transformer import frozen_values


def hold_frozen_base(
    network: Network, holders: str | list[str], model: nn.Module, part: nn.Module | None = None
) -> None:
    """Meter ``frozen_base`` (fp32 values of the frozen tensors ``part`` of ``model`` reads, default all
    of it) on each of ``holders``; nothing for a model without frozen tensors."""
    bits = FP32_BITS * frozen_values(model, part)
    if bits:
        network.hold(holders, "frozen_base", bits)
