"""Lightweight FedSL's client states between rounds: gathered from the processes after a plain round, or
averaged every I rounds (Eq. 14), a malicious client's upload poisoned as the server received it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedge.aggregation import sites
from fedge.comm import Link, nodes
from fedge.distributed import Cohort
from fedge.engine import stack_copies
from fedge.runtime.split import SplitRuntime
from fedge.runtime.split_adversary import SplitAdversary
from fedge.tensors import Tensors, floating

States = dict[str, Tensors]  # stacked "params", "buffers" and "masks" of clients


class Averaging:
    """Upload every trunk through ``link``, average uniformly (BatchNorm buffers too), broadcast, and
    recompute the masks as the non-zero pattern of the mean (``pruned``; all ones otherwise).

    Resetting the masks to all ones would let the first unmasked gradient revive every pruned weight
    whenever the mean already sits at the target count (no pruning triggers then); a mask taken from the
    mean keeps its zeros masked, and the importance sort ranks them first when the next trigger prunes
    further, so masks stay nested.

    The trained states hold the clients this process runs (``cohort``): it uploads and sums them, one
    all-reduce adds the sums, and every process then holds every client's state (the split ``runtime``'s
    transfers, aggregation and storage).

    Under an ``adversary`` the malicious clients' uploads are poisoned at receipt, before the server's
    pipeline (:meth:`~fedge.runtime.split_adversary.SplitAdversary.poison`), the last broadcast as the
    reference; :attr:`figures` holds its ``malicious`` and ``malicious_kept``.
    """

    def __init__(self, runtime: SplitRuntime, link: Link, cohort: Cohort, clients: list[str], pruned: bool):
        self.runtime, self.link, self.cohort = runtime, link, cohort
        self.clients, self.pruned = clients, pruned
        self.adversary: SplitAdversary | None = None  # malicious clients' uploaded trunks
        self.figures: dict[str, Any] = {}  # the adversary's, at the last average

    def __call__(
        self, t: int, trained: States, mask_names: list[str], reference: Tensors
    ) -> tuple[States, np.ndarray, np.ndarray]:
        """Every client's state after the averaging of round ``t`` (``reference``: the last broadcast
        trunk and buffers); the upload and broadcast bits per client."""
        n, cohort, runtime = len(self.clients), self.cohort, self.runtime
        params, buffers = trained["params"], trained["buffers"]
        sent = {**params, **floating(buffers)}
        record = runtime.ctx.records_upload(sites.SERVER)
        up = runtime.upload(cohort, self.link, t, self.clients, "model_up", sent, record=record)
        runtime.store(nodes.SERVER, "client_models", int(up.bits.sum()))
        device = next(iter(params.values())).device
        uniform = torch.full((len(cohort),), 1.0 / n, dtype=torch.float64, device=device)
        received = {k: up.payload.get(k, v) for k, v in {**params, **buffers}.items()}
        adversary, every = self.adversary, np.arange(n)
        if adversary is not None:
            received = adversary.poison(t, every, received, reference, cohort)
        summed = runtime.aggregate(t, cohort, received, uniform)
        if adversary is not None:
            weights = torch.full((n,), 1.0 / n, dtype=torch.float64, device=device)
            self.figures = adversary.figures(t, every, weights, runtime.ctx.pipeline(sites.SERVER))
        mean_params, mean_buffers = {k: summed[k] for k in params}, {k: summed[k] for k in buffers}
        mean = {**mean_params, **floating(mean_buffers)}
        down = runtime.broadcast(self.link, t, self.clients, "model_down", mean)
        params = stack_copies({k: down.payload[k] for k in mean_params}, n)
        states = {
            "params": params,
            "buffers": stack_copies({k: down.payload.get(k, v) for k, v in mean_buffers.items()}, n),
            "masks": {
                name: params[name] != 0 if self.pruned else torch.ones_like(params[name], dtype=torch.bool)
                for name in mask_names
            },
        }
        return states, up.bits, np.repeat(down.bits, n)

    def gathered(self, trained: States) -> States:
        """Every client's state from each process's rows of it (cohort order is client order); masks
        travel as bytes."""
        cohort, gather = self.cohort, self.runtime.gather
        masks = gather(cohort, {k: m.to(torch.uint8) for k, m in trained["masks"].items()})
        return {
            "params": gather(cohort, trained["params"]),
            "buffers": gather(cohort, trained["buffers"]),
            "masks": {k: m.bool() for k, m in masks.items()},
        }
