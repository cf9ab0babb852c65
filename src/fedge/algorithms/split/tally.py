"""The running figures of one split round, per participant row: what each row sent and received, the
samples each side computed on, and the losses the rows trained on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedge.distributed import Cohort
from fedge.runtime.split import SplitRuntime


@dataclass
class Tally:
    """Bits each way, samples each side computed on, and the losses the rows trained on (the round's
    simulated time and its report are read off it)."""

    up_bits: np.ndarray
    down_bits: np.ndarray
    client_samples: np.ndarray
    server_samples: np.ndarray
    loss_sum: torch.Tensor
    loss_steps: torch.Tensor
    server_loss: float = 0.0
    uploads: int = 0

    @classmethod
    def zeros(cls, count: int, device: torch.device) -> Tally:
        up, down, client, server = (np.zeros(count) for _ in range(4))
        losses, steps = torch.zeros(count, device=device), torch.zeros(count, device=device)
        return cls(up, down, client, server, losses, steps)

    def local_step(self, row_ids: torch.Tensor, counts: torch.Tensor, loss: torch.Tensor) -> None:
        """Rows ``row_ids`` took a local step on ``counts`` samples with loss ``loss``."""
        self.computed(row_ids, counts)
        self.trained(row_ids, counts, loss)

    def computed(self, row_ids: torch.Tensor, counts: torch.Tensor) -> None:
        """Rows ``row_ids`` computed a local step on ``counts`` samples (known for every row everywhere:
        the batch plans come from the seed)."""
        np.add.at(self.client_samples, row_ids.cpu().numpy(), counts.cpu().numpy())

    def trained(self, row_ids: torch.Tensor, counts: torch.Tensor, loss: torch.Tensor) -> None:
        """Rows ``row_ids`` trained on loss ``loss`` (known only where the rows trained)."""
        active = (counts > 0).to(self.loss_sum)
        self.loss_sum.index_add_(0, row_ids, loss.detach().to(self.loss_sum) * active)
        self.loss_steps.index_add_(0, row_ids, active)

    def served(self, row_ids: np.ndarray, bits: np.ndarray, counts: torch.Tensor) -> None:
        """The server received ``bits`` from rows ``row_ids`` and computed on ``counts`` samples of each."""
        np.add.at(self.up_bits, row_ids, bits)
        np.add.at(self.server_samples, row_ids, counts.cpu().numpy())

    def add_up(self, runtime: SplitRuntime, cohort: Cohort, server_losses: bool) -> None:
        """Bring the rows' losses together when the cohort is spread over processes: they are known only
        where the rows trained, other processes contribute zeros, so each row's figures come out exact;
        with ``server_losses`` (server copies, each served where its row trained) the copies' loss total
        too, as a sum of per-process sums."""
        figures = {"loss_sum": self.loss_sum, "loss_steps": self.loss_steps}
        if server_losses:
            figures["server_loss"] = torch.tensor([self.server_loss], dtype=torch.float64)
        summed = runtime.add_up(cohort, figures)
        self.loss_sum, self.loss_steps = summed["loss_sum"], summed["loss_steps"]
        if server_losses:
            self.server_loss = float(summed["server_loss"][0])

    def mean_loss(self, weights: torch.Tensor) -> float:
        """The rows' mean training loss, weighted like the aggregation."""
        per_row = (self.loss_sum / self.loss_steps.clamp_min(1)).double().cpu()
        weights = weights.cpu()
        return float((per_row * weights / weights.sum()).sum())
