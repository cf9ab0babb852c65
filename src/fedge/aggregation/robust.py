"""Byzantine-robust aggregation as pipeline stages: reducers that tolerate a few lying senders, and a
transform that bounds what any one of them can move.

Reducers: ``median`` (coordinate-wise, Yin et al., "Byzantine-robust distributed learning: towards
optimal statistical rates", 2018), ``trimmed_mean`` (ibid.), ``krum`` and ``multi_krum`` (Blanchard et
al., "Machine learning with adversaries: Byzantine tolerant gradient descent", 2017),
``geometric_median`` (RFA's smoothed Weiszfeld, Pillutla et al., "Robust aggregation for federated
learning", 2022) and ``centered_clip`` (Karimireddy et al., "Learning from history for Byzantine robust
optimization", 2021). Transform: ``norm_bound`` (norm-difference clipping, Sun et al., "Can you really
backdoor federated learning?", 2019).

Each reducer works at every site: one output (a server, the cloud, a buffer) over the rows with a
nonzero weight, or one output per receiver (edge cells, peers), each over its own nonzero-weight rows.
Outputs with the same number of rows are reduced together as one ``[outputs, rows, columns]`` batch, a
block of columns at a time (so the working memory stays a few blocks, not a copy of the stacked rows);
no loop runs over the senders. The weights choose the rows and, by their total per output, the scale
of the result (a weighted mean of weights summing to ``s`` is ``s`` times an average: 1 for a model's
mean, a server learning rate or a staleness discount for a buffer's deltas); their relative sizes are
ignored, as the papers' rules are unweighted, except by ``geometric_median``, whose RFA form weighs each
row by its share. Floating tensors are reduced together as one vector per row (Krum's distances, the
geometric median's and centred clipping's norms) or coordinate by coordinate (median, trimmed mean);
integer counters are taken as the site's mean takes them (the largest row's value at a one-output site,
each cell's largest at an edge, the receivers' own at peers). Masked (sparse) rows are refused.

None is additive: on a run whose rows are spread over processes the pipeline first gathers every
process's rows (an all-gather of ``R x d`` values to every process, each holding all of them), and every
process reduces them alike. Each reducer keeps, per output, a :class:`RobustReport` of how much every row
entered its result (:attr:`RobustReducer.reports`), what a count of kept malicious senders reads. Their
compute is charged to the run's simulated clock (:meth:`RobustReducer.charge`) with our own operation
counts (each class's ``flops``); no paper times these.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from fedge.aggregation import sites
from fedge.aggregation.means import BlockMean, WeightedMean
from fedge.aggregation.private import Clip
from fedge.aggregation.stage import OptionError, Reducer, StageRun
from fedge.aggregation.updates import Part, Updates
from fedge.comm import nodes
from fedge.errors import ConfigError
from fedge.system.clock import CLIENT_COMPUTE, SERVER_COMPUTE, RoundCost
from fedge.tensors import Tensors, floating

Result = TypeVar("Result")

BLOCK = 1 << 24
"""Values per column block (``outputs x rows x columns``): 64 MiB of float32, the working set's unit."""
SELECTION_BLOCK = 1 << 20
"""The median's and trimmed mean's block (4 MiB): a selection's copy of it stays in cache."""
ITERATIVE_BLOCK = 1 << 20
"""The geometric median's and centred clipping's block (4 MiB): a pass reads the block from memory for
its weighted sum and again from cache for its distances."""


@dataclass(frozen=True)
class RobustReport:
    """How one output's aggregate used its rows: ``rows`` are their positions in the joined updates,
    ``senders`` their client ids (where the site knows them), ``kept`` how much each entered the result
    (median, trimmed mean: the share of coordinates where it was among the values averaged; Krum: 1 if
    selected, else 0; geometric median: its final Weiszfeld weight, normalised; centred clipping: the
    factor its last step scaled its difference by), ``scores`` Krum's scores, ``iterations`` the
    iterations a Weiszfeld or clipping loop ran, and ``flops`` the operations charged."""

    output: int
    rows: tuple[int, ...]
    senders: tuple[int, ...] | None
    kept: tuple[float, ...]
    flops: float
    scores: tuple[float, ...] | None = None
    iterations: int | None = None

    @property
    def chosen(self) -> tuple[int, ...]:
        """The senders (or row positions, where senders are unknown) that entered the result at all."""
        ids = self.senders if self.senders is not None else self.rows
        return tuple(i for i, k in zip(ids, self.kept, strict=True) if k > 0)


@dataclass
class Batch:
    """The rows of ``g`` outputs that each take ``k`` rows: ``index`` ``[g, k]`` into the joined rows
    (``None``: the one output takes every row, read as views), their ``weights`` ``[g, k]``, each
    output's total weight ``scale`` ``[g]`` and the floating tensors by name."""

    rows: Tensors
    names: list[str]
    index: torch.Tensor | None
    weights: torch.Tensor
    scale: torch.Tensor
    block: int = BLOCK

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weights.shape)  # type: ignore[return-value]

    @property
    def dims(self) -> int:
        return sum(self.rows[n][0].numel() for n in self.names)

    def blocks(self) -> Iterator[tuple[str, slice, torch.Tensor]]:
        """Every tensor's columns, a block at a time: (name, columns, ``[g, k, c]`` values)."""
        g, k = self.shape
        width = max(1, self.block // (g * k))
        for name in self.names:
            flat = self.rows[name].reshape(self.rows[name].shape[0], -1)
            for start in range(0, flat.shape[1], width):
                cols = slice(start, min(start + width, flat.shape[1]))
                x = flat[:, cols]
                yield name, cols, x[None] if self.index is None else x[self.index.to(x.device)]

    def empty(self) -> Tensors:
        """Flat ``[g, d]`` outputs for every tensor, to be filled block by block."""
        g = self.shape[0]
        return {n: self.rows[n].new_empty(g, self.rows[n][0].numel()) for n in self.names}


class RobustReducer(Reducer):
    """A robust reducer (see the module): the batching by output, the integers, the reports and the
    clock's charge; a subclass writes :meth:`aggregate` over one :class:`Batch`."""

    additive: ClassVar[bool] = False  # a robust rule needs every row at once
    name: ClassVar[str]
    block: ClassVar[int] = BLOCK  # values per column block (see :class:`Batch`)

    def __init__(self) -> None:
        self.run = StageRun(sites.SERVER)
        self.reports: list[RobustReport] = []  # the last aggregation's, one per output

    def bind(self, run: StageRun) -> None:
        self.run = run

    @abstractmethod
    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        """Fill ``out`` (flat ``[g, d]`` per tensor) with the batch's robust averages (before scaling by
        the outputs' total weights); return each row's ``kept`` ``[g, k]`` and, per output, its report's
        extra fields (``flops``, ``scores``, ``iterations``). ``centre``: each output's reference, flat
        (``None`` where the reducer does not use one)."""

    uses_reference: ClassVar[bool] = False

    def reduce(self, updates: Updates) -> Tensors:
        if any(part.masks for part in updates.parts):
            raise ConfigError(self.run.key, f"{self.name} cannot reduce masked (sparse) rows")
        part = updates.joined()
        names = [n for n, t in part.rows.items() if t.is_floating_point()]
        weights = part.weights if updates.per_receiver else part.weights[None]
        outputs = weights.shape[0]
        result = {n: part.rows[n].new_empty(outputs, part.rows[n][0].numel()) for n in names}
        reports: list[RobustReport | None] = [None] * outputs
        for chosen, index in _groups(weights, updates.site, self.run.key):
            whole = outputs == 1 and index.shape[1] == weights.shape[1]
            w = torch.gather(weights[chosen], 1, index).double()
            total = w.sum(dim=1)
            batch = Batch(part.rows, names, None if whole else index, w / total[:, None], total, self.block)
            out = batch.empty()
            centre = self._centre(updates, names, chosen) if self.uses_reference else None
            kept, extras = self.aggregate(batch, out, centre)
            for name in names:
                scale = total.to(out[name].dtype)[:, None]
                scaled = out[name] if bool((scale == 1).all()) else out[name] * scale
                if len(chosen) == outputs:  # every output, in order
                    result[name] = scaled
                else:
                    result[name][chosen.to(result[name].device)] = scaled
            for j, o in enumerate(chosen.tolist()):
                rows = tuple(index[j].tolist())
                senders = None if part.senders is None else tuple(part.senders[r] for r in rows)
                reports[o] = RobustReport(o, rows, senders, tuple(kept[j].tolist()), **extras[j])  # type: ignore[arg-type]
        self.reports = [r for r in reports if r is not None]
        self.charge(updates.site)
        shaped = {}
        for n, v in result.items():
            shape = part.rows[n].shape[1:]
            shaped[n] = v.reshape(outputs, *shape) if updates.per_receiver else v[0].reshape(shape)
        return {**shaped, **_integers(updates, part)}

    def _centre(self, updates: Updates, names: list[str], chosen: torch.Tensor) -> Tensors:
        """Each chosen output's reference, flat ``[g, d]`` (the site's one model, or each receiver's)."""
        if updates.reference is None or any(n not in updates.reference for n in names):
            raise ConfigError(
                self.run.key, f"{self.name} centres on the {updates.site}'s reference; it has none"
            )
        out = {}
        for n in names:
            ref = updates.reference[n]
            flat = (
                ref.reshape(ref.shape[0], -1)[chosen.to(ref.device)]
                if updates.per_receiver
                else ref.reshape(1, -1)
            )
            out[n] = flat.to(updates.parts[0].rows[n].dtype)
        return out

    def charge(self, site: str) -> None:
        """Charge the last aggregation's operations to the clock: a server's, the cloud's or a buffer's
        processor; each edge server's own, side by side (the slowest sets the time); each peer's on its
        own client processor, in parallel. At an asynchronous buffer, whose time is its event queue's,
        only the joules (as ``secagg``)."""
        system = self.run.system
        if system is None or not self.reports:
            return
        flops = np.asarray([r.flops for r in self.reports], dtype=np.float64)
        outputs = [r.output for r in self.reports]
        if site == sites.PEER:
            cost = system.client_compute(flops, np.asarray(outputs))
            phase, payers = CLIENT_COMPUTE, cost.payers or nodes.clients(outputs)
        else:
            cost = system.server_compute(flops)
            phase = SERVER_COMPUTE
            payers = {sites.EDGE: nodes.edges(outputs), sites.CLOUD: [nodes.CLOUD] * len(outputs)}.get(
                site, [nodes.SERVER] * len(outputs)
            )
        joules: dict[str, dict[str, float]] = {}
        for node, spent in zip(payers, cost.joules.tolist(), strict=True):
            mine = joules.setdefault(node, {})
            mine[phase] = mine.get(phase, 0.0) + spent
        seconds = 0.0 if site == sites.BUFFER else float(cost.seconds.max())
        total = float(cost.joules.sum())
        system.charge(RoundCost(seconds, total, {phase: seconds} if seconds else {}, joules))


def _groups(weights: torch.Tensor, site: str, key: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The outputs by their number of rows ``k``: (outputs ``[g]``, their rows ``[g, k]`` ascending)."""
    support = weights != 0
    counts = support.sum(dim=1)
    if bool((counts == 0).any()):
        raise ConfigError(key, f"an output at the {site} has no rows to aggregate")
    for k in counts.unique().tolist():
        chosen = torch.nonzero(counts == k).flatten()
        yield chosen, torch.nonzero(support[chosen])[:, 1].reshape(len(chosen), k)


def _integers(updates: Updates, part: Part) -> Tensors:
    """The integer tensors as the site's mean takes them (an edge's per-cell maximum, a one-output
    site's largest row, peers' own values: left out)."""
    floats = floating(part.rows)
    rows = {n: t for n, t in part.rows.items() if n not in floats}
    if not rows:
        return {}
    mean = BlockMean() if updates.site == sites.EDGE else WeightedMean()
    return mean.reduce(updates.with_parts(Part(rows, part.weights, senders=part.senders)))


def _log2(k: int) -> int:
    return max(1, math.ceil(math.log2(k))) if k > 1 else 1


def _each_block(batch: Batch, work: Callable[[torch.Tensor], Result]) -> Iterator[tuple[str, slice, Result]]:
    """``(name, columns, work(block))`` for every block of ``batch`` in order (:meth:`Batch.blocks`):
    on the CPU on torch's threads, a few blocks at a time (numpy's selections release the GIL), so the
    blocks in flight stay a few whatever their number."""
    threads = torch.get_num_threads()
    if threads == 1 or any(batch.rows[n].device.type != "cpu" for n in batch.names):
        yield from ((name, cols, work(x)) for name, cols, x in batch.blocks())
        return
    with ThreadPoolExecutor(threads) as pool:
        flight: deque[tuple[str, slice, Future[Result]]] = deque()
        for name, cols, x in batch.blocks():
            flight.append((name, cols, pool.submit(work, x)))
            if len(flight) > 2 * threads:
                done = flight.popleft()
                yield done[0], done[1], done[2].result()
        while flight:
            done = flight.popleft()
            yield done[0], done[1], done[2].result()


Host = torch.Tensor | np.ndarray
"""A block as :func:`_host` gives it: a numpy view on the CPU, else the tensor."""


def _host(x: torch.Tensor) -> Host:
    """``x`` as a numpy view on the CPU, else ``x`` itself (bfloat16, which numpy lacks, aside): on the
    CPU numpy's partition, comparisons and reductions along a strided dimension are several times
    torch's, and its single-threaded loops pay no thread synchronisation on every small block."""
    return x.numpy() if x.device.type == "cpu" and x.dtype != torch.bfloat16 else x


def _like(t: torch.Tensor, x: Host) -> Host:
    """``t`` as ``x``'s kind, dtype and device."""
    if isinstance(x, np.ndarray):
        return t.to(dtype=torch.from_numpy(x[:0]).dtype, device="cpu").numpy()
    return t.to(device=x.device, dtype=x.dtype)


def _partitioned(x: Host, ranks: list[int]) -> Host:
    """``x`` (``[g, k, c]``) with each column's values along the rows partitioned at the sorted
    positions ``ranks`` (each such position holds its order statistic, lesser values before it and
    greater after, as ``numpy.partition``): numpy's introselect, one pass for every rank, for an array
    (torch has no partition); a sort for a tensor."""
    if isinstance(x, np.ndarray):  # each column's values made contiguous first: the selection's fast path
        columns = np.ascontiguousarray(x.transpose(0, 2, 1))
        columns.partition(ranks, axis=2)
        return columns.transpose(0, 2, 1)
    return x.sort(dim=1).values


def _sum(x: Host) -> torch.Tensor:
    """``x`` (``[g, k, c]``) summed over the rows in float64, ``[g, c]`` (numpy's on an array: torch's
    float64 sum along a strided dimension is far slower on the CPU)."""
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.sum(axis=1, dtype=np.float64))
    return x.sum(dim=1, dtype=torch.float64)


def _weighted(a: Host, x: Host) -> Host:
    """``sum_i a[:, i] x[:, i]``: ``a`` ``[g, k]``, ``x`` ``[g, k, c]``, ``[g, c]`` (a matrix-vector
    product per output)."""
    return (a[:, None, :] @ x)[:, 0, :]


def _rowdot(a: Host, b: Host) -> Host:
    """The dot products of ``a`` and ``b`` along their last dimension (a BLAS dot per row)."""
    return (a[..., None, :] @ b[..., :, None])[..., 0, 0]


def _f64(x: Host) -> torch.Tensor:
    """``x`` as a float64 tensor on the CPU."""
    return torch.as_tensor(x).double().cpu()


class _Sum:
    """A float64 running sum of a pass's per-block results, kept as the blocks' kind (numpy or torch)
    until :meth:`total`, so a block adds one operation."""

    def __init__(self) -> None:
        self.value: Host | None = None

    def add(self, x: Host) -> None:
        if self.value is None:
            self.value = x.astype(np.float64) if isinstance(x, np.ndarray) else x.double()
        else:
            self.value += x

    def total(self) -> torch.Tensor:
        assert self.value is not None, "a pass over no blocks"
        return _f64(self.value)


class _Views(dict[str, Any]):
    """Flat tensors by name as :func:`_host` gives them (numpy views on the CPU, written through; typed
    ``Any`` as numpy and torch index alike)."""

    def __init__(self, tensors: Tensors) -> None:
        super().__init__((n, _host(t)) for n, t in tensors.items())


class _Cast:
    """Per-row weights ``[g, k]`` as each block's kind and dtype (:func:`_like`), converted once per
    dtype."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights
        self.cast: dict[object, Host] = {}

    def __call__(self, x: Host) -> Host:
        key = (type(x), x.dtype)
        if key not in self.cast:
            self.cast[key] = _like(self.weights, x)
        return self.cast[key]


CANCELLATION = 4.0
"""The geometric median expands a squared distance into terms (``||x||^2 - 2 x.m + ||m||^2``) where they
sum in magnitude to at most this many times the distance (at most two bits lost to cancellation, their
rounding a few times the exact differences'); elsewhere it takes the differences."""


def _cancels(terms: torch.Tensor, squared: torch.Tensor) -> bool:
    """Whether any expansion's ``terms`` (the sum of its terms' magnitudes) exceed
    :data:`CANCELLATION` times its squared distance."""
    return bool((terms > CANCELLATION * squared).any())


@functools.cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController()


def _one_blas_thread() -> AbstractContextManager[object]:
    """numpy's BLAS limited to one thread: its threads cost far more in synchronisation than they save
    on a block's matrix-vector products (tens of microseconds of work each)."""
    return _blas().limit(limits=1, user_api="blas")


def _count(where: Host) -> torch.Tensor:
    """Each row's count of the columns where ``where`` (``[g, k, c]``) holds, ``[g, k]`` float64 on the
    CPU."""
    counts = where.sum(axis=2) if isinstance(where, np.ndarray) else where.sum(dim=2)
    return torch.as_tensor(counts).double().cpu()


class Median(RobustReducer):
    """The coordinate-wise median of each output's rows (the mean of the two middle values for an even
    count, as ``numpy.median``): tolerates fewer than half the rows lying in any coordinate (Yin et al.
    2018). Unweighted. One selection per coordinate for both middle values (:func:`_partitioned`); a
    row's ``kept`` counts the coordinates where its value is a middle one (twice where both middle
    values are its). Cost: ``2 k d`` comparisons per output counted."""

    name = "median"
    block = SELECTION_BLOCK

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        g, k = batch.shape
        kept = torch.zeros(g, k, dtype=torch.float64)
        middle = sorted({(k - 1) // 2, k // 2})

        def select(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = _host(x)
            ranked = _partitioned(a, middle)
            values = [ranked[:, r] for r in middle]
            middle_value = values[0] if len(values) == 1 else (values[0] + values[1]) / 2
            counts = [_count(cast(Host, a == value[:, None])) for value in values]
            return torch.as_tensor(middle_value), counts[0] if len(counts) == 1 else counts[0] + counts[1]

        for name, cols, (value, count) in _each_block(batch, select):
            out[name][:, cols] = value
            kept += count
        kept = kept / batch.dims
        flops = float(2 * k * batch.dims)
        return kept, [{"flops": flops}] * g


class TrimmedMean(RobustReducer):
    """The coordinate-wise trimmed mean: per coordinate, the ``b`` largest and ``b`` smallest values
    dropped and the rest averaged (Yin et al. 2018). ``trim``: a fraction of each output's ``k`` rows
    (``b = floor(trim k)``, as Flower's and SciPy's ``trim_mean``; in ``[0, 0.5)``) or a count per side
    (an integer); ``trim: 0`` is the plain unweighted mean. Unweighted. One selection per coordinate
    partitions the values at both cuts (:func:`_partitioned`, no sort) and the middle ones are summed in
    float64; a row's ``kept`` is the share of coordinates where its value lies between the cuts (a value
    tied with a cut counts as kept). Cost: ``2 k ceil(log2 b) d`` comparisons and ``2 k d`` additions
    per output (``k d`` when nothing is trimmed)."""

    name = "trimmed_mean"
    block = SELECTION_BLOCK

    def __init__(self, trim: float | int = 0.1):
        super().__init__()
        if isinstance(trim, bool) or not isinstance(trim, int | float):
            raise OptionError("trim", f"{trim!r} must be a fraction in [0, 0.5) or a count of rows per side")
        if isinstance(trim, float) and not 0.0 <= trim < 0.5:
            raise OptionError("trim", f"{trim!r} as a fraction must be in [0, 0.5)")
        if isinstance(trim, int) and trim < 0:
            raise OptionError("trim", f"{trim!r} as a count must be non-negative")
        self.trim = trim

    def cut(self, k: int) -> int:
        """Rows trimmed per side of ``k``."""
        b = int(self.trim * k) if isinstance(self.trim, float) else self.trim
        if 2 * b >= k:
            raise ConfigError(
                f"{self.run.key}.options.trim", f"trimming {b} per side leaves none of {k} rows"
            )
        return b

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        g, k = batch.shape
        b = self.cut(k)
        cut = torch.zeros(g, k, dtype=torch.float64)
        if b == 0:
            for name, cols, x in batch.blocks():
                out[name][:, cols] = x.mean(dim=1)

        def trimmed(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = _host(x)
            ranked = _partitioned(a, [b, k - b - 1])
            dropped = _count(a < ranked[:, b, None]) + _count(a > ranked[:, k - b - 1, None])
            return _sum(ranked[:, b : k - b]) / (k - 2 * b), dropped

        for name, cols, (value, dropped) in _each_block(batch, trimmed) if b else ():
            out[name][:, cols] = value
            cut += dropped
        if b == 0:
            kept = torch.ones(g, k, dtype=torch.float64)
            flops = float(k * batch.dims)
        else:
            kept = 1.0 - cut / batch.dims  # the share of coordinates where a row was not cut
            flops = float((2 * k * _log2(b) + 2 * k) * batch.dims)
        return kept, [{"flops": flops}] * g


class MultiKrum(RobustReducer):
    """Multi-Krum (Blanchard et al. 2017): each row scored by the sum of its squared L2 distances (over
    every floating tensor, one vector) to its ``k - f - 2`` nearest other rows, and the unweighted mean
    of the ``keep`` best-scored taken (``keep`` unset: ``k - f``). ``byzantine`` is ``f``, the senders
    assumed to lie; the paper's guarantee needs ``k > 2f + 2`` rows, refused otherwise. With ``f = 0``
    and ``keep = k`` it is the plain mean. Unweighted (Flower's ``aggregate_krum`` averages the kept
    rows by their sample counts). Ties go to the lower row. Cost per output: ``2 k^2 d`` for the Gram
    matrix of the rows, ``k d`` to centre them and ``keep d`` for the mean."""

    name = "multi_krum"

    def __init__(self, byzantine: int = 0, keep: int | None = None):
        super().__init__()
        if isinstance(byzantine, bool) or not isinstance(byzantine, int) or byzantine < 0:
            raise OptionError("byzantine", f"{byzantine!r} must be a non-negative integer")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise OptionError("keep", f"{keep!r} must be a positive integer")
        self.byzantine, self.keep = byzantine, keep

    def kept_count(self, k: int) -> int:
        """How many rows of ``k`` are averaged (refusing a count Krum cannot score)."""
        f = self.byzantine
        if k <= 2 * f + 2:
            raise ConfigError(
                f"{self.run.key}.options.byzantine",
                f"Krum needs more than 2f + 2 = {2 * f + 2} rows; an output has {k}",
            )
        m = k - f if self.keep is None else self.keep
        if m > k:
            raise ConfigError(f"{self.run.key}.options.keep", f"keep {m} is more than an output's {k} rows")
        return m

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        g, k = batch.shape
        m = self.kept_count(k)
        gram = torch.zeros(g, k, k, dtype=torch.float64)
        for _, _, x in batch.blocks():
            centred = x - x.mean(dim=1, keepdim=True)  # distances do not move; the Gram's rounding does
            gram += (centred @ centred.transpose(1, 2)).double().cpu()
        norms = gram.diagonal(dim1=1, dim2=2)
        distances = (norms[:, :, None] + norms[:, None, :] - 2 * gram).clamp_min(0)
        distances.diagonal(dim1=1, dim2=2).fill_(math.inf)
        nearest = distances.sort(dim=2).values[:, :, : k - self.byzantine - 2]
        scores = nearest.sum(dim=2)
        best = scores.sort(dim=1, stable=True).indices[:, :m]
        for name, cols, x in batch.blocks():
            picked = torch.gather(x, 1, best.to(x.device)[:, :, None].expand(g, m, x.shape[2]))
            out[name][:, cols] = picked.mean(dim=1)
        kept = torch.zeros(g, k, dtype=torch.float64).scatter_(1, best, 1.0)
        flops = float((2 * k * k + k + m) * batch.dims)
        return kept, [{"flops": flops, "scores": tuple(s.tolist())} for s in scores]


class Krum(MultiKrum):
    """Krum (Blanchard et al. 2017): the one row of best score (Multi-Krum with ``keep: 1``; see
    :class:`MultiKrum`), as Flower's ``aggregate_krum`` with ``to_keep=0``."""

    name = "krum"

    def __init__(self, byzantine: int = 0):
        super().__init__(byzantine, keep=1)


class _Iterative(RobustReducer):
    """A reducer that moves a point ``v`` per output by rounds over the rows, each round one pass over
    the columns that computes the next ``v`` block by block and, with it, every row's squared distance
    to it. Its block products run on numpy's BLAS on one thread (:func:`_one_blas_thread`)."""

    block = ITERATIVE_BLOCK

    def step(self, batch: Batch, out: Tensors, move: torch.Tensor, base: Tensors | None) -> torch.Tensor:
        """``v <- (base + ) sum_i move[:, i] (x_i - base)`` written into ``out`` (``base`` ``None``: a
        weighted sum of the rows), and each row's squared distance to the new ``v`` ``[g, k]``, exactly
        (from the differences)."""
        squared = _Sum()
        views, weights = _Views(out), _Cast(move)
        for name, cols, x in batch.blocks():
            h = _host(x)
            if base is None:
                v = _weighted(weights(h), h)
            else:
                b = _like(base[name][:, cols], h)
                v = b + _weighted(weights(h), h - b[:, None])
            views[name][:, cols] = v
            gap = h - v[:, None]
            squared.add(_rowdot(gap, gap))
        return squared.total()


class GeometricMedian(_Iterative):
    """RFA's geometric median (Pillutla et al. 2022): the point minimising ``sum_i a_i ||v - x_i||`` over
    each output's rows (every floating tensor, one vector), by the smoothed Weiszfeld iteration ``v <-
    sum_i b_i x_i / sum_i b_i`` with ``b_i = a_i / max(eps, ||v - x_i||)``, from the weighted mean, for at
    most ``iterations`` steps and until the objective improves by at most ``tolerance`` of itself. The
    weights ``a`` are the site's, normalised per output (RFA's weighted form: a FedAvg server's sample
    counts), the one robust rule here that uses them.

    One pass over the rows per step, each block read once: its weighted sum (a matrix-vector product)
    and, from the cache, the rows' products with the new point, from which the distances follow by
    expansion about the mean (:meth:`_mean`, :meth:`_moved`; the rows' squared norms read once, row by
    row, before); where the expansion's terms would cancel (:data:`CANCELLATION`: rows far from the
    origin next to their spread, as models rather than their changes) the distances are taken exactly
    from the differences (:meth:`step`), from then on. Cost per output: ``6 k d`` for the mean (``11 k
    d`` where its distances are taken exactly), then per iteration run ``4 k d`` (``5 k d`` once exact,
    ``9 k d`` for the step whose expansion cancelled)."""

    name = "geometric_median"

    def __init__(self, iterations: int = 100, eps: float = 1e-6, tolerance: float = 1e-6):
        super().__init__()
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
            raise OptionError("iterations", f"{iterations!r} must be a non-negative integer")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise OptionError("eps", f"{eps!r} must be a positive number")
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
            raise OptionError("tolerance", f"{tolerance!r} must be a non-negative number")
        self.iterations, self.eps, self.tolerance = iterations, float(eps), float(tolerance)

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        with _one_blas_thread():
            return self._weiszfeld(batch, out)

    def _weiszfeld(self, batch: Batch, out: Tensors) -> tuple[torch.Tensor, list[dict[str, object]]]:
        g, k = batch.shape
        kd = k * batch.dims
        alpha = batch.weights.cpu()
        start, norms, mean_norm, exact = self._mean(batch, out, alpha)
        mean = dict(out)  # the steps rebind out's tensors, so these stay the mean
        flops = (11.0 if exact else 6.0) * kd
        squared = start
        objective = (alpha * squared.sqrt()).sum(dim=1)
        active = torch.ones(g, dtype=torch.bool)
        ran = torch.zeros(g, dtype=torch.long)
        charged = torch.full((g,), flops, dtype=torch.float64)
        for _ in range(self.iterations):
            if not bool(active.any()):
                break
            beta = alpha / squared.sqrt().clamp_min(self.eps)
            beta = beta / beta.sum(dim=1, keepdim=True)
            moved = batch.empty()
            new, cost = None, 0.0
            if not exact:
                new, cost = self._moved(batch, moved, beta, mean, start, norms, mean_norm, active), 4.0 * kd
            if new is None:
                exact, new, cost = True, self.step(batch, moved, beta, None), cost + 5.0 * kd
            for name in out:
                keep = active.to(out[name].device)[:, None]
                out[name] = moved[name] if bool(active.all()) else torch.where(keep, moved[name], out[name])
            improved = (alpha * new.sqrt()).sum(dim=1)
            squared = torch.where(active[:, None], new, squared)
            ran += active.long()
            charged += active.double() * cost
            done = (objective - improved).abs() <= self.tolerance * improved
            objective = torch.where(active, improved, objective)
            active &= ~done
        weight = alpha / squared.sqrt().clamp_min(self.eps)
        kept = weight / weight.sum(dim=1, keepdim=True)
        extras: list[dict[str, object]] = [
            {"flops": float(f), "iterations": int(r)} for f, r in zip(charged, ran, strict=True)
        ]
        return kept, extras

    def _mean(
        self, batch: Batch, out: Tensors, alpha: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """The weighted mean ``m`` into ``out``; each row's squared distance to it and squared norm
        ``[g, k]``, ``||m||^2`` ``[g]`` (float64), and whether the distances were taken exactly. They
        are ``||x||^2 - 2 x.m + ||m||^2``, the norms read row by row (contiguous, faster than from a
        block's cache) and the products from each block's cache; or, where those terms would cancel,
        the differences' (one more pass)."""
        norms = self._norms(batch)
        cross, mean_norm = _Sum(), _Sum()
        views, weights = _Views(out), _Cast(alpha)
        for name, cols, x in batch.blocks():
            h = _host(x)
            v = _weighted(weights(h), h)
            views[name][:, cols] = v
            cross.add((h @ v[..., None])[..., 0])
            mean_norm.add(_rowdot(v, v))
        squared = norms - 2 * cross.total() + mean_norm.total()[:, None]
        mean_norm_total = mean_norm.total()
        if not _cancels((norms.sqrt() + mean_norm_total.sqrt()[:, None]).square(), squared):
            return squared, norms, mean_norm_total, False
        return self.step(batch, batch.empty(), alpha, None), norms, mean_norm_total, True

    @staticmethod
    def _norms(batch: Batch) -> torch.Tensor:
        """Each output's rows' squared norms ``[g, k]`` (float64), every joined row's read once along
        its contiguous values."""
        total: torch.Tensor | float = 0.0
        for name in batch.names:
            flat = batch.rows[name].reshape(batch.rows[name].shape[0], -1)
            total = total + _f64(_rowdot(_host(flat), _host(flat)))
        norms = cast(torch.Tensor, total)
        return norms[None] if batch.index is None else norms[batch.index.cpu()]

    def _moved(
        self,
        batch: Batch,
        out: Tensors,
        move: torch.Tensor,
        mean: Tensors,
        start: torch.Tensor,
        norms: torch.Tensor,
        mean_norm: torch.Tensor,
        active: torch.Tensor,
    ) -> torch.Tensor | None:
        """``v <- sum_i move[:, i] x_i`` into ``out`` and each row's squared distance to it ``[g, k]``, by
        expansion about the mean ``m``: ``||x - m||^2 - 2 (x - m).u + ||u||^2`` with ``u = v - m``, the
        products ``x.u`` from the cache; ``None`` where, on an active output, those terms would cancel
        (:data:`CANCELLATION`; ``(x - m).u`` bounded by ``(||x|| + ||m||) ||u||``)."""
        sums, mean_sums, steps = _Sum(), _Sum(), _Sum()
        views, means, weights = _Views(out), _Views(mean), _Cast(move)
        for name, cols, x in batch.blocks():
            h = _host(x)
            v = _weighted(weights(h), h)
            views[name][:, cols] = v
            m = means[name][:, cols]
            u = v - m
            sums.add((h @ u[..., None])[..., 0])
            mean_sums.add(_rowdot(m, u))
            steps.add(_rowdot(u, u))
        cross, mean_cross, step = sums.total(), mean_sums.total(), steps.total()
        squared = (start - 2 * (cross - mean_cross[:, None]) + step[:, None]).clamp_min(0)
        bound = 2 * (norms.sqrt() + mean_norm.sqrt()[:, None]) * step.sqrt()[:, None]
        terms = start + bound + step[:, None]
        return None if _cancels(terms[active], squared[active]) else squared


class CenteredClip(_Iterative):
    """Centred clipping (Karimireddy et al. 2021): from the site's reference ``v`` (the previous
    aggregate a server broadcast, each peer's own model, no change for a buffer's deltas), ``iterations``
    steps of ``v <- v + (1/k) sum_i min(1, tau / ||x_i - v||) (x_i - v)`` over each output's rows (every
    floating tensor, one vector): a row further than ``tau`` from the centre moves it by at most
    ``tau / k``. Unweighted. Cost per output: ``3 k d`` for the first distances, ``5 k d`` per step."""

    name = "centered_clip"
    uses_reference = True

    def __init__(self, tau: float = 1.0, iterations: int = 1):
        super().__init__()
        if isinstance(tau, bool) or not isinstance(tau, int | float) or not tau > 0:
            raise OptionError("tau", f"{tau!r} must be a positive number")
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise OptionError("iterations", f"{iterations!r} must be a positive integer")
        self.tau, self.iterations = float(tau), iterations

    def aggregate(
        self, batch: Batch, out: Tensors, centre: Tensors | None
    ) -> tuple[torch.Tensor, list[dict[str, object]]]:
        assert centre is not None
        g, k = batch.shape
        squared = torch.zeros(g, k, dtype=torch.float64)
        for name, cols, x in batch.blocks():
            gap = x - centre[name][:, cols].to(x.device)[:, None]
            squared += torch.linalg.vector_norm(gap, dim=2).double().square().cpu()
        base = centre
        factor = torch.ones(g, k, dtype=torch.float64)
        with _one_blas_thread():
            for _ in range(self.iterations):
                factor = (self.tau / squared.sqrt().clamp_min(1e-300)).clamp_max(1.0)
                squared = self.step(batch, out, factor / k, base)
                base = {n: v.clone() for n, v in out.items()}
        flops = float((3 + 5 * self.iterations) * k * batch.dims)
        return factor, [{"flops": flops, "iterations": self.iterations}] * g


class NormBound(Clip):
    """Norm-difference clipping (Sun et al. 2019): each row's change from the site's reference, over
    every floating tensor, scaled down to L2 norm at most ``bound`` (rows within it unchanged), the
    site's weights kept. It is the ``clip`` transform with a fixed bound and ``weights: samples`` under
    the defence's name (see :class:`~fedge.aggregation.private.Clip`); at an edge each row is measured
    from its own cell's model. Refused at peers, where a row reaches several receivers whose models
    differ, so no one change of it is defined. Not charged to the clock (one pass, ``3 R d``, as
    ``clip``)."""

    def __init__(self, bound: float = 1.0):
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
            raise OptionError("bound", f"{bound!r} must be a positive number")
        super().__init__(clip=float(bound))

    def apply(self, updates: Updates) -> Updates:
        if updates.site == sites.PEER:
            where = f"set at: [{', '.join(s for s in (sites.SERVER, sites.EDGE, sites.CLOUD, sites.BUFFER))}]"
            raise ConfigError(
                self.key, f"norm_bound measures a row from one model, and peers have many; {where}"
            )
        return super().apply(updates)


ROBUST = {
    "median": Median,
    "trimmed_mean": TrimmedMean,
    "krum": Krum,
    "multi_krum": MultiKrum,
    "geometric_median": GeometricMedian,
    "centered_clip": CenteredClip,
    "norm_bound": NormBound,
}
"""The robust stages by their config names."""
