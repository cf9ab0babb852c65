"""Measuring tools of the benchmark: device-synchronised timing, the matmul peak, FLOPs, resident memory.

The physical limit a training round is compared against is the machine's own dense fp32 matrix
multiply, measured here, not a datasheet figure. FLOPs are counted by ``torch.utils.flop_counter`` on a
real training step of the model (matrix products and convolutions, forward and backward as executed),
and also in the common "3 x forward" convention (model FLOPs), which counts the input gradient of the
first layer that training never computes.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedge.engine.host import available_cores

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so a timer read afterwards covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn()`` takes, including the device work it queued."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def matmul_peak(device: torch.device, repeats: int = 7) -> dict[str, float]:
    """Achieved fp32 FLOP/s of a large square matrix product on ``device`` (median of ``repeats``)."""
    n = 2048 if device.type == "cpu" else 8192
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=gen)
    b = torch.randn(n, n, device=device, generator=gen)
    for _ in range(2):
        torch.mm(a, b)
    seconds = median([timed(lambda: torch.mm(a, b), device) for _ in range(repeats)])
    return {"size": n, "gflops": 2 * n**3 / seconds / 1e9}


def flops_per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """FLOPs of training on one sample: as executed (forward + backward) and as 3 x forward.

    ``x``/``y`` is one batch; counts are divided by its size. The module is used as is (train mode).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    with FlopCounterMode(display=False) as forward:
        logits = model(x)
    with FlopCounterMode(display=False) as step:
        loss = F.cross_entropy(model(x), y)
        torch.autograd.grad(loss, params)
    del logits
    size = len(y)
    return {
        "executed": step.get_total_flops() / size,
        "model": 3 * forward.get_total_flops() / size,
    }


def _status_kib(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM), or None where there is no /proc."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int | None:
    """Current resident set size of this process."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS counter (Linux ``clear_refs``); False where that is not possible."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


class RssSampler:
    """Samples this process's RSS every ``interval`` seconds in a thread; ``peak`` is the largest seen.

    The kernel's own peak counter (VmHWM) is not enough on its own: RSS counters are cached per CPU
    and the peak is brought up to date lazily, so a large tensor mapped and unmapped within a round
    can be missing from it (seen here: a 1.9 GB transient that VmHWM never showed).
    """

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm", "rb", buffering=0) as statm:
            while not self._stop.is_set():
                statm.seek(0)
                self.peak = max(self.peak, int(statm.read().split()[1]) * page)
                time.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        if Path("/proc/self/statm").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def peak_rss_bytes() -> int:
    """Peak resident set size since the last :func:`reset_peak_rss` (else since the process started)."""
    kib = _status_kib("VmHWM")
    if kib is None:  # ru_maxrss is in KiB on Linux, bytes on macOS
        scale = 1 if platform.system() == "Darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return kib * 1024


def machine(device: torch.device) -> dict[str, object]:
    """What the figures were measured on."""
    info: dict[str, object] = {
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cores_available": available_cores(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other jobs on a shared machine show here)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
