"""Seed derivation: every random draw in fedge comes from a generator derived from the run seed.

A stream is named by ``(seed, purpose, *keys)`` (for example ``(7, "batches", round, client)``), so a
draw never depends on how many other draws happened before it: sequential and batched executors,
resumed runs and any grouping of clients see the same numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def derive_seed(seed: int, purpose: str, *keys: int | str) -> int:
    """A 63-bit seed for the stream named by ``(seed, purpose, *keys)``."""
    text = "/".join([str(int(seed)), purpose, *(str(k) for k in keys)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def numpy_rng(seed: int, purpose: str, *keys: int | str) -> np.random.Generator:
    """A NumPy generator for the named stream."""
    return np.random.default_rng(derive_seed(seed, purpose, *keys))


@contextmanager
def global_stream(seed: int, purpose: str, *keys: int | str) -> Iterator[None]:
    """Inside the block, torch's global generator draws the named stream; outside, it is untouched.

    For code that draws from the global generator and cannot be handed one (building ``nn.Module``s with
    their default initialisation).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, purpose, *keys))
        yield


def torch_rng(
    seed: int, purpose: str, *keys: int | str, device: str | torch.device = "cpu"
) -> torch.Generator:
    """A torch generator for the named stream (on ``device``)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, purpose, *keys))
    return gen
