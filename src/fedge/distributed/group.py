"""The processes of one run and the few collectives fedge needs, each exact and in rank order.

``SINGLE`` is the one-process group: every collective returns its input. ``TorchGroup`` wraps the
default ``torch.distributed`` process group that ``torchrun`` describes in the environment
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...); gloo on CPU, NCCL when the run's device is CUDA. Every
collective has the run's timeout (``engine.dist_timeout``); a peer that died or stopped answering
becomes a one-line :class:`DistError` instead of a hang or a traceback.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import torch

from fedge.distributed.lifeline import die_with_parent
from fedge.errors import EXIT_PEER_LOST, FedgeError
from fedge.tensors import Tensors

T = TypeVar("T")

_LEFT_KEY = "fedge/left-last-barrier"  # store counter: ranks out of the closing barrier, at exit
_CLOSED_KEY = "fedge/group-closed"  # store counter: ranks other than 0 whose group is down
_EXIT_WAIT_S = 30.0  # the longest a rank waits at exit for its peers to reach the same point


def _wait_count(store: Any, key: str, count: int) -> None:
    """Wait (at most ``_EXIT_WAIT_S``) until the store's counter ``key`` reaches ``count``."""
    deadline = time.monotonic() + _EXIT_WAIT_S
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(0.005)


class DistError(FedgeError):
    """A collective failed: a peer process died, or did not answer within ``engine.dist_timeout``.

    Its exit code tells the launcher this rank failed because of another (:mod:`fedge.distributed.launch`).
    """

    exit_code = EXIT_PEER_LOST


class Group:
    """One process: rank 0 of 1. Subclasses talk to their peers; here every collective is the identity."""

    rank = 0
    size = 1

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def writes(self) -> bool:
        """Whether this process writes the run directory (rank 0 only)."""
        return self.rank == 0

    def sum_tensors(self, tensors: Tensors) -> Tensors:
        """Element-wise sum over ranks of floating tensors, maximum of integer ones (one call per dtype)."""
        return tensors

    def sum_float(self, value: float) -> float:
        """A float summed over ranks in float64."""
        return value

    def gather_rows(self, tensors: Tensors) -> Tensors:
        """Every rank's rows (dimension 0) concatenated in rank order."""
        return tensors

    def gather_array(self, values: np.ndarray) -> np.ndarray:
        """Every rank's 1-D array concatenated in rank order (exact: integers stay integers)."""
        return np.asarray(values)

    def all_objects(self, value: T) -> list[T]:
        """Every rank's (picklable) value, in rank order."""
        return [value]

    def broadcast(self, value: T) -> T:
        """Rank 0's (picklable) value on every rank."""
        return value

    def barrier(self) -> None:
        """Wait until every rank got here."""


SINGLE = Group()


class TorchGroup(Group):
    """The default ``torch.distributed`` process group, started from ``torchrun``'s environment."""

    def __init__(self, timeout_s: float, cuda: bool):
        import torch.distributed as dist

        self.dist = dist
        self.timeout_s = timeout_s
        self.rank = int(os.environ.get("RANK", "0"))  # until the group says
        if not dist.is_initialized():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if cuda:
                torch.cuda.set_device(local % torch.cuda.device_count())
            self._call(
                "start",
                lambda: dist.init_process_group(
                    "nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s)
                ),
            )
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.failed = False
        self.in_step = False  # whether the last collective was a barrier every rank has left
        atexit.register(self.close)
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        self.in_step = False
        try:
            out = fn()
            self.in_step = what == "barrier"
            return out
        except (RuntimeError, ValueError, ConnectionError) as error:
            self.failed = True
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise DistError(
                f"distributed: rank {self.rank}: {what} failed: a peer process stopped or did"
                f" not answer within engine.dist_timeout={self.timeout_s:g}s ({first[:200]})"
            ) from None

    def close(self) -> None:
        """At exit: take the group down (after a failure there is nobody left to tell).

        A rank that tears gloo down while a peer is still inside the last collective, or after its store
        host (rank 0) has exited, can abort in C++ ("terminate called without an active exception")
        once all its work is done. So when the ranks left their last collective in step (a run's
        closing barrier), each says so on the rendezvous store and waits for the others before it
        destroys the group, and rank 0 leaves only once every other rank has said its group is gone.
        A rank that stopped mid-run skips the waits: its peers are not coming."""
        if not self.dist.is_initialized() or self.failed:
            return
        try:
            store = self.dist.distributed_c10d._get_default_store()
            if self.in_step:
                store.add(_LEFT_KEY, 1)
                _wait_count(store, _LEFT_KEY, self.size)
            self.dist.destroy_process_group()
            if self.in_step and self.rank:
                store.add(_CLOSED_KEY, 1)
            elif self.in_step:
                _wait_count(store, _CLOSED_KEY, self.size - 1)
        except (RuntimeError, ValueError, ConnectionError):
            pass  # a peer already gone at exit: nothing is left to take down in step

    def sum_tensors(self, tensors: Tensors) -> Tensors:
        out: dict[str, torch.Tensor] = {}
        by_dtype: dict[torch.dtype, list[str]] = {}
        for name, t in tensors.items():
            by_dtype.setdefault(t.dtype, []).append(name)
        for dtype, names in by_dtype.items():
            flat = torch.cat([tensors[n].reshape(-1) for n in names]).to(self.device)
            op = self.dist.ReduceOp.SUM if dtype.is_floating_point else self.dist.ReduceOp.MAX
            self._call("all_reduce", lambda flat=flat, op=op: self.dist.all_reduce(flat, op=op))
            offset = 0
            for n in names:
                t = tensors[n]
                out[n] = flat[offset : offset + t.numel()].reshape(t.shape).to(t.device)
                offset += t.numel()
        return {n: out[n] for n in tensors}

    def sum_float(self, value: float) -> float:
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        self._call("all_reduce", lambda: self.dist.all_reduce(total))
        return float(total.item())

    def gather_rows(self, tensors: Tensors) -> Tensors:
        counts = self.all_objects({n: int(t.shape[0]) for n, t in tensors.items()})
        out = {}
        for name, t in tensors.items():
            sizes = [c[name] for c in counts]
            padded = torch.zeros((max(sizes), *t.shape[1:]), dtype=t.dtype, device=self.device)
            padded[: t.shape[0]] = t.to(self.device)
            parts = [torch.empty_like(padded) for _ in range(self.size)]
            self._call("all_gather", lambda parts=parts, padded=padded: self.dist.all_gather(parts, padded))
            out[name] = torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]).to(t.device)
        return out

    def gather_array(self, values: np.ndarray) -> np.ndarray:
        parts = self.all_objects(np.asarray(values))
        return np.concatenate(parts) if parts else np.asarray(values)

    def all_objects(self, value: T) -> list[T]:
        out: list[Any] = [None] * self.size
        self._call("all_gather_object", lambda: self.dist.all_gather_object(out, value))
        return out

    def broadcast(self, value: T) -> T:
        box = [value if self.rank == 0 else None]
        self._call("broadcast_object_list", lambda: self.dist.broadcast_object_list(box, src=0))
        return box[0]

    def barrier(self) -> None:
        self._call("barrier", lambda: self.dist.barrier())


_CURRENT: list[Group] = []


def launched() -> bool:
    """Whether this process was started by a launcher as one of several ranks (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def launched_rank() -> int:
    """This process's rank as the launcher set it (0 when not launched as ranks), before any group exists."""
    return int(os.environ.get("RANK", "0")) if launched() else 0


def current_group(timeout_s: float = 1800.0, cuda: bool = False) -> Group:
    """The run's group: ``SINGLE`` unless launched as several ranks (then started once per process)."""
    if not launched():
        return SINGLE
    if not _CURRENT:
        die_with_parent()  # no orphan rank outlives its launcher
        _CURRENT.append(TorchGroup(timeout_s, cuda))
    return _CURRENT[0]
