"""FedProx (Li et al., 2020) as a new fedge algorithm: FedAvg whose clients add a proximal term."""

from typing import Literal

from pydantic import Field

import fedge
from fedge.algorithms.fedavg import FedAvg, FedAvgConfig
from fedge.engine import classification_loss, make_step


class FedProxConfig(FedAvgConfig):
    """FedAvg's knobs plus the proximal weight mu."""

    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0.0, description="proximal weight mu of the local objective (Eq. 2)")


class FedProx(FedAvg):
    """FedProx: clients minimise F_k(w) + mu/2 ||w - w_t||^2 from the global model w_t."""

    def __init__(self, ctx, cfg: FedProxConfig):
        super().__init__(ctx, cfg)
        task_loss = classification_loss(self.model, ctx.criterion)

        def proximal_loss(params, buffers, x, y, weight):
            loss, new_buffers = task_loss(params, buffers, x, y, weight)
            # self.params is the global model w_t while the round's clients train
            drift = sum(((params[k] - self.params[k]) ** 2).sum() for k in params)
            return loss + cfg.mu / 2 * drift, new_buffers

        self.step = make_step(proximal_loss, self.sgd)


fedge.register_algorithm("fedprox", FedProx, FedProxConfig)
