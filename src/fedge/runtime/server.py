"""The server's own round (centralized training): one learner on the server, its compute the round.

Centralized training sends nothing: a round is the server training on the pooled data, and the clock
advances by the server's compute time (:func:`fedge.system.server_round`). :class:`ServerRuntime` holds
the model in the server's storage and closes each round, so that the algorithm writes neither.
"""

from __future__ import annotations

from torch import nn

from fedge.comm import nodes
from fedge.data.federated import BatchPlan
from fedge.runtime.context import Context
from fedge.runtime.storage import hold_frozen_base
from fedge.system import forward_flops, server_round, training_flops
from fedge.tensors import Tensors


class ServerRuntime:
    """The rounds of ``model`` trained on the server alone: the server holds its initial ``state``."""

    def __init__(self, ctx: Context, model: nn.Module, state: Tensors):
        self.ctx = ctx
        ctx.network.hold(nodes.SERVER, "model", state)
        hold_frozen_base(ctx.network, nodes.SERVER, model)
        self.flops_per_sample = forward_flops(model, ctx.data.input_shape)

    def close(self, plan: BatchPlan) -> None:
        """Advance the clock by the round: the server's compute on the samples of ``plan``."""
        flops = float(training_flops(self.flops_per_sample, float(plan.weight.sum())))
        self.ctx.system.charge(server_round(self.ctx.system, flops))
