"""One split round's participants: who they are, with what weight and step sizes, their stacked client
state and the round's running figures."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedge.algorithms.split.arrival import Timeline
from fedge.algorithms.split.clients import State, as_state
from fedge.algorithms.split.participation import Draws
from fedge.algorithms.split.tally import Tally
from fedge.distributed import Cohort
from fedge.engine import ClientBank
from fedge.engine.noise import RowKeys
from fedge.metrics import RoundReport
from fedge.tensors import rows


@dataclass
class Round:
    """One round's participants: their draws and node names, aggregation weights, step sizes, stacked
    client state, noise keys and running figures.

    ``cohort`` says which of the rows this process runs (all of them in one process): the stacked state
    holds those rows, everything else is the whole cohort's.
    """

    t: int
    draws: Draws
    nodes: list[str]
    weights: torch.Tensor
    lr_client: float
    lr_server: float
    rows: ClientBank
    keys: RowKeys | None
    tally: Tally
    cohort: Cohort
    timeline: Timeline | None = None  # the simulated queue of ``server_order: arrival``

    @classmethod
    def trained(
        cls,
        t: int,
        draws: Draws,
        nodes: list[str],
        weights: torch.Tensor,
        lrs: tuple[float, float],
        rows: ClientBank,
        cohort: Cohort,
    ) -> Round:
        """A round of rows that have trained already (their client models in ``rows``), to upload and
        average them: no noise keys, an empty tally (asynchronous CSE-FSL's merge of arrived models)."""
        tally = Tally.zeros(len(draws), weights.device)
        return cls(t, draws, nodes, weights, *lrs, rows, None, tally, cohort)

    def state(self, subset: torch.Tensor | None) -> State:
        """The stacked state of the rows ``subset`` (all rows for None)."""
        bank = self.rows
        full = (bank.params, bank.buffers, bank.opt_state)
        return full if subset is None else as_state(tuple(rows(t, subset) for t in full))

    def write_back(self, subset: torch.Tensor | None, state: State) -> None:
        """Write back the state of the rows ``subset`` (all rows for None)."""
        if subset is None:
            self.rows.adopt(*state, owned=False)
            return
        for full, part in zip((self.rows.params, self.rows.buffers, self.rows.opt_state), state, strict=True):
            for name, value in part.items():
                full[name] = full[name].index_put((subset,), value)

    def report(self, totals: dict[str, int], extra: dict[str, float]) -> RoundReport:
        """The round's training loss and traffic figures, with ``extra``; the run's ``totals`` move on."""
        tally = self.tally
        totals["uploads"] += tally.uploads
        totals["server_steps"] += tally.uploads
        figures = {
            "server_loss": tally.server_loss / max(tally.uploads, 1),
            "participants": len(self.draws),
            "uploads": tally.uploads,
            "uploads_total": totals["uploads"],
            "server_steps_total": totals["server_steps"],
            "lr": self.lr_client,
            **extra,
        }
        return RoundReport(tally.mean_loss(self.weights), figures)
