"""The server exchange: what crosses the cut at one local step, and the server's answer.

Participants upload their smashed data (``smashed_up``) and labels (``labels_up``, on a link of their own
so that label-free figures such as CSE-FSL's Table V can be read off), the server part serves them in
the order the round's :class:`~fedge.algorithms.split.order.ServerOrder` gives, and for SplitFed the
cut-layer gradients go back (``grad_down``). Every bit and sample lands in the round's tally.

The round's rows may be spread over processes (the round's cohort): each process sends its own rows,
and the cohort's sends record the whole exchange in every process's ledger, so every row's bits are
known everywhere. One shared server model takes every row: the processes' smashed rows are gathered
(cohort order is row order) and every process takes the same server steps on the same batch, so the
model stays identical everywhere without a broadcast, and a process then keeps its own rows' answer (a
single serving process would take as long, the others waiting at the next collective). Server copies
are independent: each process serves its own rows' copies.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from fedge.algorithms.split.order import ServerOrder
from fedge.algorithms.split.padding import sent_entries, sent_targets
from fedge.algorithms.split.privacy import CutPrivacy
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import CutBatch, Served, SplitServer
from fedge.comm import FloatCodec
from fedge.distributed import Cohort
from fedge.runtime.split import SplitRuntime
from fedge.runtime.split_adversary import SplitAdversary


class Uploaded(NamedTuple):
    """A step's cut batch as the server received it, the bits each exchange row sent, and the entries
    sent (``None``: every entry of the real rows; else pad positions left out)."""

    batch: CutBatch
    bits: np.ndarray
    keep: torch.Tensor | None


class ServerExchange:
    """The cut links (``smashed_up``, ``labels_up``, ``grad_down``), the server part behind them and its
    queue policy; the transfers go through the split ``runtime``."""

    def __init__(
        self,
        runtime: SplitRuntime,
        codecs: tuple[str, str],
        server: SplitServer,
        order: ServerOrder,
        padded: bool = False,
    ):
        network = runtime.ctx.network
        self.up, self.down = network.link(codecs[0]), network.link(codecs[1])
        self.padded = padded  # the model reads padded sequences: pad positions are never sent
        # labels are integers: a dense float codec carries them exactly, a lossy one would corrupt them
        self.labels = self.up if isinstance(self.up.codec, FloatCodec) else network.link("fp32")
        self.runtime, self.server, self.order = runtime, server, order
        self.privacy: CutPrivacy | None = None  # privacy.cut's noise on what crosses the cut
        self.adversary: SplitAdversary | None = None  # malicious clients' smashed data

    def __call__(self, rnd: Round, row_ids: torch.Tensor, batch: CutBatch, step: int, grad_z: bool) -> Served:
        """Upload local step ``step``'s cut batch of rows ``row_ids`` of the round, let the server serve
        it, and return its answer with the cut-layer gradients as the clients receive them (zero for rows
        that sent nothing).

        ``batch.y``, ``counts`` and ``keys`` are every exchange row's; ``batch.z`` holds this process's
        rows of them (the round's cohort; all of them in one process, or in a pass of one row,
        ``batch.rows``), and the answer is for those rows.
        """
        runtime = self.runtime
        cohort = rnd.cohort if batch.rows is None else runtime.whole(len(row_ids))
        senders = [rnd.nodes[int(r)] for r in row_ids]
        at, lengths = row_ids.cpu().numpy(), runtime.local_rows(cohort, batch.counts)
        batch = self.noised(rnd, cohort, at, batch, lengths, step)
        sent = self._upload(rnd, cohort, senders, batch, lengths)
        rnd.tally.served(at, sent.bits, batch.counts)
        queued = self.order.queue(rnd, step, at, sent.bits, batch.counts)
        served = self._serve(rnd, cohort, sent.batch, grad_z, queued.order)
        rnd.tally.uploads += len(queued.order)
        if not grad_z:
            self.record(rnd, at, sent.batch, None, step)
            return served
        assert served.grad_z is not None, "the server returns the cut-layer gradient when asked for it"
        grad = served.grad_z
        if self.privacy is not None:
            own = runtime.local_rows(cohort, at)
            clients, occurrence = rnd.draws.clients[own], rnd.draws.occurrence[own]
            grad = self.privacy.gradient(rnd.t, clients, occurrence, step, grad, lengths)
        answer = {"g": grad}
        grads = runtime.answer(cohort, self.down, rnd.t, senders, "grad_down", answer, lengths=lengths,
                               entry_mask=sent.keep)  # fmt: skip
        np.add.at(rnd.tally.down_bits, at, grads.bits)
        if queued.finish is not None:
            self.order.returned(rnd, at, queued, grads.bits)
        self.record(rnd, at, sent.batch, grads.payload["g"], step)
        return Served(served.loss, grads.payload["g"])

    def record(
        self, rnd: Round, at: np.ndarray, received: CutBatch, grad: torch.Tensor | None, step: int
    ) -> None:
        """Hand the exchange to the run's recorder (``output.record``): the smashed data and labels as the
        server received them, the cut gradients as the clients did."""
        recorder = self.runtime.ctx.recorder
        if not recorder.recording_cut or received.samples is None:
            return
        data = self.runtime.ctx.data
        if self.adversary is not None and self.adversary.backdoor is not None:
            data = self.adversary.backdoor.training  # the stamped copies sent are among its samples
        seen = {"smashed": received.z, "labels": received.y, "cut_gradients": grad}
        recorder.cut_step(rnd.draws.clients[at], step, received.samples, received.counts, seen,
                          (data.x_train, data.y_train))  # fmt: skip

    def noised(
        self, rnd: Round, cohort: Cohort, at: np.ndarray, batch: CutBatch, lengths: torch.Tensor, step: int
    ) -> CutBatch:
        """``batch`` with ``privacy.cut``'s noise on this process's rows of smashed data (as it is), then
        as the malicious clients send it (:mod:`~fedge.runtime.split_adversary`)."""
        if self.privacy is None and self.adversary is None:
            return batch
        own = self.runtime.local_rows(cohort, at)
        clients, occurrence = rnd.draws.clients[own], rnd.draws.occurrence[own]
        z = batch.z
        if self.privacy is not None:
            z = self.privacy.smashed(rnd.t, clients, occurrence, step, z, lengths)
        if self.adversary is not None:
            z = self.adversary.smashed(rnd.t, clients, occurrence, step, z, lengths)
        return batch._replace(z=z)

    def _upload(
        self, rnd: Round, cohort: Cohort, senders: list[str], batch: CutBatch, lengths: torch.Tensor
    ) -> Uploaded:
        """Send this process's rows' smashed data (a padded sequence's pad positions left out) and labels;
        the batch as the server receives it and every exchange row's bits."""
        t, runtime = rnd.t, self.runtime
        keep = sent_entries(batch.z, lengths) if self.padded else None
        z = {"z": batch.z.detach()}
        smashed = runtime.upload(
            cohort, self.up, t, senders, "smashed_up", z, lengths=lengths, entry_mask=keep
        )
        y = runtime.local_rows(cohort, batch.y)
        targets = sent_targets(y, lengths) if self.padded else None
        labels = runtime.upload(
            cohort, self.labels, t, senders, "labels_up", {"y": y}, lengths=lengths, entry_mask=targets
        )
        return Uploaded(batch._replace(z=smashed.payload["z"]), smashed.bits + labels.bits, keep)

    def _serve(self, rnd: Round, cohort: Cohort, batch: CutBatch, grad_z: bool, order: list[int]) -> Served:
        """The server's answer to this process's rows of ``batch`` (whose ``z`` holds only those rows);
        its loss enters the round's tally."""
        own, shared = self.runtime.local_rows, self.server.sequential
        if shared:
            batch = batch._replace(z=self.runtime.gather(cohort, {"z": batch.z})["z"])
        else:
            keys = None if batch.keys is None else own(cohort, batch.keys)
            batch = batch._replace(y=own(cohort, batch.y), counts=own(cohort, batch.counts), keys=keys)
        served = self.server.serve(batch, rnd.lr_server, grad_z, order)
        rnd.tally.server_loss += float(served.loss.sum())
        if not shared:
            return served
        return Served(own(cohort, served.loss), None if served.grad_z is None else own(cohort, served.grad_z))

    def begin(self, rnd: Round) -> None:
        """The round's rows have their models: start the server's queue."""
        self.order.begin(rnd)
