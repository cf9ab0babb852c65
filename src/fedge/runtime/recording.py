"""What a run keeps of its transfers for the leakage attacks (``output.record``, ``fedge attack``).

A curious server's attacks need what it saw: the smashed data and labels that reached it across the cut,
the cut gradients it sent back (what a client, or an eavesdropper on the downlink, sees), and the client
updates a FedAvg server received. Keeping all of them would cost more than the run, so a recorded round
(``record_every``) keeps a seeded uniform sample: ``record_samples`` cut transfers (reservoir sampling over
every sample the round sends, Vitter's Algorithm R, so the sample does not lean to the first steps) and
``record_clients`` of the participants' updates. The values are the ones on the wire, after the codec,
the privacy mechanisms and an adversary (what the receiver decoded).

Beside each recorded transfer the record keeps its ground truth, which no attacker sees and only the
scoring reads: the sample's index, raw input and true label. It also keeps what the attacker is assumed
to know: the client model broadcast at the round's start (split learning; a SplitFed server averages it)
and the global model a FedAvg update started from with the local step size. ``bytes`` says what a round's
record costs on disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from fedge.config import OutputConfig
from fedge.rng import numpy_rng
from fedge.tensors import Tensors

CUT_KINDS = ("smashed", "cut_gradients", "labels")


def records_round(output: OutputConfig, t: int, rounds: int) -> bool:
    """Whether round ``t`` of a run of ``rounds`` is recorded: 1, 1 + every, 1 + 2 every..., and the last."""
    return bool(output.record) and ((t - 1) % output.record_every == 0 or t == rounds)


def _numpy(value: torch.Tensor) -> np.ndarray:
    """A tensor as a host array (floating values as float32, the attacks' precision)."""
    value = value.detach().cpu()
    return (value.float() if value.is_floating_point() else value).numpy()


class Reservoir:
    """A seeded uniform sample of at most ``size`` items of a stream of unknown length (Algorithm R): the
    i-th item (1-based) takes a free slot while there is one, else replaces slot ``j`` for a uniform
    ``j < i`` when ``j < size``."""

    def __init__(self, size: int, rng: np.random.Generator):
        self.size, self.rng, self.seen = size, rng, 0
        self.fields: dict[str, np.ndarray] = {}

    def offer(self, items: dict[str, np.ndarray]) -> None:
        """Offer ``n`` items (every array's first dimension is the item)."""
        count = len(next(iter(items.values())))
        slots = np.empty(count, dtype=np.int64)
        for i in range(count):
            self.seen += 1
            slots[i] = self.seen - 1 if self.seen <= self.size else int(self.rng.integers(0, self.seen))
        for name, values in items.items():
            if name not in self.fields:
                self.fields[name] = np.zeros((self.size, *values.shape[1:]), dtype=values.dtype)
            for item in np.flatnonzero(slots < self.size):  # in order: a later item overwrites an earlier one
                self.fields[name][slots[item]] = values[item]

    def arrays(self) -> dict[str, np.ndarray]:
        """The kept items (fewer than ``size`` when the stream was shorter)."""
        kept = min(self.seen, self.size)
        return {name: values[:kept] for name, values in self.fields.items()}


@dataclass
class TransferRecorder:
    """Keeps a recorded round's transfers (the algorithms hand them over at the point of transfer) until
    the runner takes them and writes them to the run directory."""

    output: OutputConfig
    rounds: int
    seed: int
    current: int = 0  # the round being recorded (0: none)
    cut: Reservoir | None = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self.output.record)

    def begin(self, t: int) -> None:
        """Round ``t`` starts; whether it is recorded follows ``output.record_every``."""
        self.current = t if records_round(self.output, t, self.rounds) else 0
        self.arrays, self.cut = {}, None
        if self.current and self.kinds & set(CUT_KINDS):
            self.cut = Reservoir(self.output.record_samples, numpy_rng(self.seed, "record-cut", t))

    @property
    def recording_cut(self) -> bool:
        return self.cut is not None

    @property
    def recording_updates(self) -> bool:
        """Whether this round's client updates are kept (a recorded round of a run recording them)."""
        return bool(self.current) and "updates" in self.kinds

    def model(self, prefix: str, params: Tensors, buffers: Tensors) -> None:
        """The model the attacker knows this round (``client_model``: the broadcast split trunk)."""
        if not self.current:
            return
        for name, value in {**params, **buffers}.items():
            self.arrays[f"{prefix}/{name}"] = _numpy(value)

    def cut_step(
        self,
        clients: np.ndarray,
        step: int,
        samples: torch.Tensor,
        counts: torch.Tensor,
        received: Mapping[str, torch.Tensor | None],
        truth: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        """One exchange across the cut: row ``r`` (of client ``clients[r]``) sent its first ``counts[r]``
        samples ``samples[r]``; ``received`` holds ``smashed``, ``labels`` (``[R, B, ...]``, as the server
        received them) and ``cut_gradients`` (as the clients received them, None: none came back);
        ``truth`` is the training set's inputs and labels, the ground truth the scoring reads."""
        if self.cut is None:
            return
        rows, cols = torch.nonzero(
            torch.arange(samples.shape[1], device=counts.device) < counts[:, None], as_tuple=True
        )
        index = samples[rows, cols]
        items = {
            "cut/client": np.asarray(clients)[rows.cpu().numpy()],
            "cut/step": np.full(len(rows), step, dtype=np.int64),
            "cut/sample": _numpy(index),
            "cut/input": _numpy(truth[0][index]),
            "cut/true_label": _numpy(truth[1][index]),
        }
        for kind, value in received.items():
            if kind in self.kinds and value is not None:
                items[f"cut/{kind}"] = _numpy(value[rows, cols])
        self.cut.offer(items)

    def updates(
        self,
        clients: np.ndarray,
        received: Tensors,
        reference: Tensors,
        samples: list[np.ndarray],
        local: dict[str, float | np.ndarray],
        truth: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        """The participants' uploaded models as the server received them (row ``r`` from client
        ``clients[r]``, trained on the samples ``samples[r]``) and the global model ``reference`` they
        started from; ``local`` the local work (step size, epochs, batch size)."""
        if not self.recording_updates:
            return
        rng = numpy_rng(self.seed, "record-updates", self.current)
        keep = np.sort(rng.permutation(len(clients))[: self.output.record_clients])
        width = self.output.record_samples
        chosen = [samples[r][:width] for r in keep]
        padded = np.full((len(keep), width), -1, dtype=np.int64)
        for i, used in enumerate(chosen):
            padded[i, : len(used)] = used
        gather = torch.as_tensor(np.where(padded < 0, 0, padded), device=truth[0].device)
        self.arrays.update({
            "updates/client": np.asarray(clients)[keep],
            "updates/sample": padded,
            "updates/input": _numpy(truth[0][gather]),
            "updates/true_label": _numpy(truth[1][gather]),
        })  # fmt: skip
        rows = torch.as_tensor(keep, device=next(iter(received.values())).device)
        for name, value in received.items():
            self.arrays[f"updates/delta/{name}"] = _numpy(value[rows] - reference[name])
            self.arrays[f"global/{name}"] = _numpy(reference[name])
        for name, figure in local.items():  # per-participant values (each one's steps) for the kept rows
            kept_value = np.asarray(figure)
            self.arrays[f"updates/{name}"] = kept_value[keep] if kept_value.ndim else kept_value

    def take(self) -> dict[str, np.ndarray]:
        """The round's record (empty when the round was not recorded), and forget it."""
        arrays = dict(self.arrays)
        if self.cut is not None:
            arrays.update(self.cut.arrays())
        self.current, self.cut, self.arrays = 0, None, {}
        return arrays
