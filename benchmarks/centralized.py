"""The centralized reference: plain PyTorch training of the same model on the same samples.

One epoch over the union of the clients' samples with the same batch size and optimizer, written the
way a PyTorch user would (``nn.Module``, ``torch.optim.SGD``, one backward per batch). Batches come
from fedge's pooled batch plan, so the order is seeded like everything else; the index tensor is moved
to the device once per epoch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedge.data.federated import FederatedData


class CentralizedEpoch:
    """Trains ``model`` (in place) one epoch per call on all training samples of ``data``."""

    def __init__(self, model: nn.Module, data: FederatedData, batch_size: int, lr: float):
        self.model = model
        self.pooled = data.pooled()
        self.batch_size = batch_size
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def __call__(self, epoch: int) -> float:
        """Train one epoch (batch order of ``epoch``); the mean training loss, read once at the end."""
        data, model, opt = self.pooled, self.model, self.optimizer
        plan = data.batch_plan([0], epoch, 1, self.batch_size)
        index, weight = plan.index[0], plan.weight[0]
        full = int(weight.sum(dim=1).eq(self.batch_size).sum())
        model.train()
        total = torch.zeros((), device=data.device)
        for s in range(int(plan.steps[0])):
            idx = index[s] if s < full else plan.client_batch(0, s)
            loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
        return float(total) / max(int(plan.steps[0]), 1)
