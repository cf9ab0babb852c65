"""Host settings for fast CPU training: intra-op threads, and reuse of freed memory by the C allocator.

Why the allocator: the batched executor's gradient at every step is as large as the whole stacked
parameter set (63 MB for 100 MLP clients). glibc hands blocks that large back to the kernel when they
are freed (``mmap`` / ``munmap``), so the next step faults the same pages back in, zero-filled: on a
2-core machine that was about a third of a FedAvg round. Keeping freed memory in the heap lets the next
step reuse it. The setting is process-wide, which is why it is a switch (``engine.retain_memory``)
rather than a side effect of importing fedge.
"""

from __future__ import annotations

import ctypes
import os
import sys

import torch

# mallopt parameters from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 2**31 - 1  # the largest value mallopt takes (it is a C int)
# glibc's largest dynamic mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): with the default
# settings, a freed block up to this size raises the threshold, and later blocks of its size are reused
# from the heap instead of being mapped and zero-filled anew
REUSED_BLOCK_BYTES = 32 * 2**20

_retaining = False


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def retain_freed_memory() -> bool:
    """Make glibc keep freed blocks of any size for reuse instead of returning them to the kernel.

    Returns whether the setting was applied (False off Linux or on a C library without ``mallopt``).
    Memory then stays at its high-water mark until the process exits, which is what a training process
    allocating the same tensors every step wants.
    """
    global _retaining
    if not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    _retaining = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _retaining


def retaining_memory() -> bool:
    """Whether :func:`retain_freed_memory` is in effect in this process."""
    return _retaining


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the kernel now (glibc ``malloc_trim``); False if unavailable.

    With freed memory retained, a long run's heap fragments: blocks freed in one round are split by
    small allocations and the next round's large tensors land in fresh memory while the old blocks
    stay resident. Trimming once per training call keeps the reuse within a round (where the same
    tensors are allocated at every step) and drops what a round left behind.
    """
    if not sys.platform.startswith("linux"):
        return False
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return bool(malloc_trim(0)) if malloc_trim is not None else False


def configure_host(threads: int | None = None, retain_memory: bool = False) -> None:
    """Apply ``threads`` (torch intra-op threads; None leaves torch's choice) and the allocator switch."""
    if threads:
        torch.set_num_threads(threads)
    if retain_memory:
        retain_freed_memory()
