"""The local steps of a split round (Algorithm 1's inner loop): every step of the round's rows, each with
its exchange with the server.

On several processes this process steps its own rows (the round's cohort); every process walks the whole
plan, so all of them reach each step's exchange and know every row's sample counts, and a process whose
rows have no sample at a step still takes part in the exchange with rows that send nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedge.algorithms.split.clients import ClientSide, State
from fedge.algorithms.split.exchange import ServerExchange
from fedge.algorithms.split.private_step import SampleDP
from fedge.algorithms.split.round import Round
from fedge.algorithms.split.server import SERVER_STAGE, CutBatch, Served
from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine.noise import RowKeys
from fedge.runtime.split import SplitRuntime
from fedge.runtime.split_adversary import SplitAdversary


@dataclass(frozen=True)
class LocalRun:
    """The rows of one local run (all the round's rows, or one row in turn) and their plan."""

    subset: torch.Tensor | None  # the run's rows of the round (None: all of them)
    index: torch.Tensor  # sample indices [rows, steps, batch]
    weight: torch.Tensor  # 0/1 sample weights, like ``index``
    row_ids: torch.Tensor  # the run's rows, numbered in the round
    keys: RowKeys | None  # every run row's noise keys
    local_rows: slice  # this process's rows of the run
    local_keys: RowKeys | None  # this process's rows' noise keys

    @classmethod
    def of(cls, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None, runtime: SplitRuntime) -> LocalRun:
        """The run of the rows ``subset`` of round ``rnd`` (all of them for None) by ``plan``."""
        if subset is None:
            index, weight, keys = plan.index, plan.weight, rnd.keys
            mine = runtime.local_slice(rnd.cohort)
            row_ids = torch.arange(index.shape[0], device=index.device)
        else:
            index, weight, row_ids = plan.index[subset], plan.weight[subset], subset
            keys, mine = None if rnd.keys is None else rnd.keys.rows(subset), slice(None)
        local_keys = None if keys is None else RowKeys(keys.base[mine])
        return cls(subset, index, weight, row_ids, keys, mine, local_keys)


class LocalSteps:
    """Runs a round's local steps: the clients' step, the server exchange, and with ``agg_every`` the
    averaging (``synchronise``: aggregate, then broadcast) after every ``agg_every`` steps."""

    def __init__(
        self,
        data: FederatedData,
        clients: ClientSide,
        exchange: ServerExchange,
        uploads_at: Callable[[int], bool],
        agg_every: int | None,
        synchronise: Callable[[Round], None],
    ):
        self.data, self.clients, self.exchange = data, clients, exchange
        self.uploads_at, self.agg_every, self.synchronise = uploads_at, agg_every, synchronise
        self.sent_labels = data.y_train  # the labels the server sees (privacy.labels: randomized once)
        self.sample: SampleDP | None = None  # privacy.sample: every client step is DP-SGD
        self.adversary: SplitAdversary | None = None  # label_flip: the malicious clients' flipped labels

    def training(self, t: int) -> FederatedData:
        """The data round ``t``'s steps read: under ``label_flip``, once the malicious clients attack,
        their labels flipped (for their local loss and for the server alike)."""
        return self.data if self.adversary is None else self.adversary.data(t, self.data)

    def sent(self, t: int) -> torch.Tensor:
        """Every training sample's label as the server receives it in round ``t`` (``privacy.labels``:
        randomized once; ``label_flip``: the malicious clients' flipped, the two never together)."""
        data = self.training(t)
        return self.sent_labels if data is self.data else data.y_train

    def __call__(self, rnd: Round, plan: BatchPlan, subset: torch.Tensor | None) -> None:
        """Every local step of the rows ``subset`` (all rows for None), with its server traffic."""
        run = LocalRun.of(rnd, plan, subset, self.exchange.runtime)
        state, steps = rnd.state(subset), run.index.shape[1]
        for s in range(steps):
            counts = (run.weight[:, s] > 0).sum(dim=1)
            if not bool(counts.any()):
                continue
            state = self._step(rnd, run, state, s, counts)
            if self.agg_every is not None and (s + 1) % self.agg_every == 0 and s + 1 < steps:
                rnd.write_back(subset, state)
                self.synchronise(rnd)
                state = rnd.state(subset)
        rnd.write_back(subset, state)

    def _step(self, rnd: Round, run: LocalRun, state: State, s: int, counts: torch.Tensor) -> State:
        """Local step ``s`` of the run's rows (``counts`` samples each); their new state."""
        every, mine = run.weight[:, s], run.local_rows
        data, labels = self.training(rnd.t), self.sent(rnd.t)
        x, y = data.x_train[run.index[mine, s]], data.y_train[run.index[:, s]]
        sent = y if labels is data.y_train else labels[run.index[:, s]]

        def exchange(z: torch.Tensor, grad_z: bool) -> Served:
            keys = None if run.keys is None else run.keys.at(s, SERVER_STAGE)
            batch = CutBatch(run.subset, z, sent, counts, keys, samples=run.index[:, s])
            return self.exchange(rnd, run.row_ids, batch, s, grad_z)

        upload, own = self.uploads_at(s), counts[mine]
        if bool(own.any()):
            keys = None if run.local_keys is None else run.local_keys.at(s)
            batch = (x, y[mine], every[mine])
            noise = None
            if self.sample is not None:
                at = run.row_ids[mine].cpu().numpy()
                noise = self.sample.at(rnd.t, rnd.draws.clients[at], rnd.draws.occurrence[at], s, own)
            step = self.clients.step(state, batch, own, rnd.lr_client, keys, exchange, upload, noise)
        else:  # spread over processes: this process's rows idle at this step while others' step
            step = self.clients.idle(state, run.index.shape[2], exchange, upload)
        rnd.tally.computed(run.row_ids, counts)
        rnd.tally.trained(run.row_ids[mine], own, step.loss)
        return step.state
