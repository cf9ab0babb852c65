"""Keyed randomness inside training: the same dropout masks for a client whichever way it is run.

A draw made while training (a dropout mask) must not depend on how many clients train beside it, in
which order, or in which process, or the sequential and batched executors (and, later, any number of
ranks) would train different models. So such draws do not come from a global generator: each row of a
training call gets a key from the stream ``(seed, purpose, round, phase, client, occurrence)`` (the
phase counts the training calls of a round, the occurrence the earlier rows of the same client in the
call), mixed with the step on the device, and dropout derives its mask from that key, the layer's
place in the forward pass and each entry's position through a counter-based hash. Under ``vmap`` the
key is just another batched input, so every client's mask is the one the sequential loop draws.

:func:`keyed_noise` makes ``torch.nn.functional.dropout`` (what ``nn.Dropout`` calls) use the key;
other random functions are left to torch's global generator, which the runner seeds per round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fedge.rng import derive_seed

MASK32 = 0xFFFFFFFF
# odd multipliers of the integer mixers (each split in 16-bit halves, so int64 products never overflow)
_MIX = (0x7FEB352D, 0x846CA68B)
_STEP, _STAGE, _LAYER = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D


def _mul32(x: torch.Tensor, multiplier: int) -> torch.Tensor:
    """``x * multiplier mod 2^32`` for int64 tensors holding 32-bit values, without overflow."""
    low, high = multiplier & 0xFFFF, multiplier >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with good avalanche (xor-shift-multiply), on int64 tensors."""
    x = x & MASK32
    x = _mul32(x ^ (x >> 16), _MIX[0])
    x = _mul32(x ^ (x >> 15), _MIX[1])
    return x ^ (x >> 16)


def uniform(key: torch.Tensor, salt: int, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """Uniform ``[0, 1)`` float32 values of ``shape``, a pure function of ``key``, ``salt`` and position."""
    position = torch.arange(shape.numel(), device=device, dtype=torch.int64).reshape(shape)
    seed = mix32(key ^ mix32(torch.as_tensor(salt * _LAYER, dtype=torch.int64, device=device)))
    bits = mix32(position ^ seed)
    return (bits >> 8).to(torch.float32) * (1.0 / (1 << 24))


class _KeyedDropout(TorchFunctionMode):
    """Routes ``F.dropout`` to a mask derived from ``key``; counts the calls to tell layers apart."""

    def __init__(self, key: torch.Tensor):
        super().__init__()
        self.key = key
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.dropout:
            return func(*args, **kwargs)
        x, p, training = _dropout_arguments(args, kwargs)
        self.calls += 1
        if not training or p == 0.0:
            return x
        if p == 1.0:
            return x * 0.0
        keep = uniform(self.key, self.calls, x.shape, x.device) >= p
        return x * keep.to(x.dtype) / (1.0 - p)


def _dropout_arguments(args: tuple, kwargs: dict) -> tuple[torch.Tensor, float, bool]:
    names = ("input", "p", "training", "inplace")
    bound = dict(zip(names, args, strict=False)) | kwargs
    return bound["input"], float(bound.get("p", 0.5)), bool(bound.get("training", True))


def keyed_noise(key: torch.Tensor | None) -> AbstractContextManager:
    """Inside the block, dropout draws its masks from ``key`` (a 32-bit value; a batched one under
    ``vmap``). ``None`` leaves torch's own dropout in place (a no-op context, cheap enough to enter at
    every local step)."""
    return nullcontext() if key is None else _KeyedDropout(key)


def has_random_layers(model: nn.Module) -> bool:
    """Whether ``model`` has layers that draw randomness in training (dropout of any kind)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())


@dataclass(frozen=True)
class RowKeys:
    """The noise keys of the rows of one training phase; :meth:`at` derives a step's keys on the device."""

    base: torch.Tensor  # int64 [rows], 32-bit values

    def at(self, step: int, stage: int = 0) -> torch.Tensor:
        """Every row's key at local step ``step`` (``stage`` tells apart draws of one step, e.g. client
        and server parts of a split model)."""
        salt = (step * _STEP + stage * _STAGE) & MASK32
        return mix32(self.base ^ mix32(torch.full_like(self.base, salt)))

    def grid(self, steps: int) -> torch.Tensor:
        """``[rows, steps]``: every row's key at every step (stage 0)."""
        return torch.stack([self.at(s) for s in range(steps)], dim=1) if steps else self.base[:, None][:, :0]

    def rows(self, index: torch.Tensor | Sequence[int]) -> RowKeys:
        """The keys of a subset of rows."""
        return RowKeys(self.base[torch.as_tensor(index, device=self.base.device)])


class NoiseStreams:
    """The root of a run's keyed noise: the runner opens one stream per round (and per evaluation), and
    every training call of that round takes the next phase of it."""

    def __init__(self, seed: int, device: torch.device):
        self.seed = seed
        self.device = device
        self.purpose = "train"
        self.round = 0
        self.phase = 0

    def open(self, purpose: str, round_: int) -> None:
        """Start the stream of ``purpose`` (``train``, ``evaluate``) in round ``round_``."""
        self.purpose, self.round, self.phase = purpose, round_, 0

    def next_phase(self, clients: Iterable[int]) -> RowKeys:
        """Keys for the rows ``clients`` of the next training phase of the open stream."""
        self.phase += 1
        seen: dict[int, int] = {}
        keys = []
        for c in clients:
            occurrence = seen.get(int(c), 0)
            seen[int(c)] = occurrence + 1
            keys.append(
                derive_seed(self.seed, self.purpose, self.round, self.phase, int(c), occurrence) & MASK32
            )
        return RowKeys(torch.tensor(keys, dtype=torch.int64, device=self.device))
