"""Codecs: how a payload crosses a link, and exactly how many bits it takes.

A codec turns a payload into what the receiver decodes (after any loss of precision, :meth:`Codec.encode`)
and says how many bits each sender put on the link (:meth:`Codec.bits`), so the ledger records what was
really sent rather than ``numel * 32``. Payloads are dicts of tensors; a *stacked* payload has a leading
sender dimension and costs one bit count per sender. Bits are a function of how many values each sender
sends of each tensor (and, for value-dependent codes, how many of them are non-zero), so a sender that
sends only part of its row (the real rows of a padded batch, the entries kept by dropout) is counted
without encoding that part again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from fedge.tensors import Tensors


@dataclass(frozen=True)
class Encoded:
    """A payload as decoded by the receiver, and the bits each sender put on the link."""

    payload: Tensors
    bits: np.ndarray  # int64, one entry per sender (a single entry for an unstacked payload)


def value_counts(tensors: Tensors, stacked: bool) -> np.ndarray:
    """``[senders, tensors]``: how many values each sender holds of each tensor."""
    senders = next(iter(tensors.values())).shape[0] if stacked and tensors else 1
    counts = [t[0].numel() if stacked else t.numel() for t in tensors.values()]
    return np.tile(np.asarray(counts, dtype=np.int64), (senders, 1))


def nonzero_counts(tensors: Tensors, stacked: bool) -> np.ndarray:
    """``[senders, tensors]``: how many non-zero values each sender holds of each tensor."""
    columns = []
    for t in tensors.values():
        flat = t.reshape(t.shape[0], -1) if stacked else t.reshape(1, -1)
        columns.append(torch.count_nonzero(flat, dim=1).cpu().numpy())
    return np.stack(columns, axis=1).astype(np.int64) if columns else np.zeros((1, 0), dtype=np.int64)


class Codec(ABC):
    """Encodes a dict of tensors for one link direction."""

    name: str
    counts_nonzeros: bool = False  # whether :meth:`bits` depends on how many values are non-zero
    stochastic: bool = False  # whether :meth:`encode` draws from the senders' ``seeds``
    lossless: bool = False  # whether receivers decode exactly what was sent

    @abstractmethod
    def encode(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Tensors:
        """What the receiver decodes from ``tensors``.

        ``stacked`` payloads have a leading sender dimension; stochastic codecs draw each sender's
        randomness from its entry of ``seeds`` (derived from the run seed by the caller).
        """

    @abstractmethod
    def bits(self, values: np.ndarray, nonzeros: np.ndarray | None = None) -> np.ndarray:
        """Bits per sender, given ``values[s, k]`` values of tensor ``k`` sent by sender ``s`` (and
        ``nonzeros[s, k]`` of them non-zero, for codecs that count them)."""

    def transmit(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Encoded:
        """Encode ``tensors`` whole: what the receiver gets and the bits it cost."""
        nonzeros = nonzero_counts(tensors, stacked) if self.counts_nonzeros else None
        return Encoded(
            self.encode(tensors, stacked, seeds), self.bits(value_counts(tensors, stacked), nonzeros)
        )


class FloatCodec(Codec):
    """Dense floating point at a fixed width: ``fp32`` is lossless, ``fp16`` rounds to half precision."""

    def __init__(self, name: str, dtype: torch.dtype):
        self.name = name
        self.dtype = dtype
        self.bits_per_value = torch.finfo(dtype).bits
        self.lossless = dtype == torch.float32

    def encode(self, tensors: Tensors, stacked: bool = False, seeds: list[int] | None = None) -> Tensors:
        return {
            key: t.to(self.dtype).to(t.dtype) if self.dtype != t.dtype else t for key, t in tensors.items()
        }

    def bits(self, values: np.ndarray, nonzeros: np.ndarray | None = None) -> np.ndarray:
        return values.sum(axis=1) * self.bits_per_value
