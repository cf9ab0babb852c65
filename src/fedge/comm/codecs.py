"""Codecs: how a payload crosses a link, and exactly how many bits it takes.

A codec returns the payload as the receiver sees it (after any loss of precision) together with its
bit count, so the ledger records what was really sent rather than ``numel * 32``. Payloads are dicts
of tensors; a *stacked* payload has a leading client dimension and gets one bit count per client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Encoded:
    """A payload as decoded by the receiver, and the bits each sender put on the link."""

    payload: Tensors
    bits: np.ndarray  # int64, one entry per sender (a single entry for an unstacked payload)


class Codec(ABC):
    """Encodes a dict of tensors for one link direction."""

    name: str

    @abstractmethod
    def transmit(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Encoded:
        """Encode and decode ``tensors``: what the receiver gets and the bits it cost.

        ``stacked`` payloads have a leading sender dimension; stochastic codecs draw each sender's
        randomness from its entry of ``seeds`` (derived from the run seed by the caller).
        """


class FloatCodec(Codec):
    """Dense floating point at a fixed width: ``fp32`` is lossless, ``fp16`` rounds to half precision."""

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype
        self.bits_per_value = torch.finfo(dtype).bits

    def transmit(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Encoded:
        payload = {}
        values = 0
        senders = 1
        for key, tensor in tensors.items():
            payload[key] = tensor.to(self.dtype).to(tensor.dtype) if self.dtype != tensor.dtype else tensor
            values += tensor[0].numel() if stacked else tensor.numel()
            senders = tensor.shape[0] if stacked else 1
        bits = np.full(senders, values * self.bits_per_value, dtype=np.int64)
        return Encoded(payload, bits)
