"""Batch plans of a round's draws (one row per draw, local epochs or exactly K steps), and its step sizes.

Rows come from :meth:`FederatedData.batch_plan`, so a client's first run in a round sees the same
batches as under FedAvg or centralized training (stream ``"batches"``); a repeated draw of the same
client (sampling with replacement) uses the stream ``"batches-repeat<k>"`` so its run differs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedge.algorithms.split.config import SplitConfig
from fedge.algorithms.split.participation import Draws
from fedge.data.federated import BatchPlan, FederatedData


def _stack(plans: list[tuple[np.ndarray, BatchPlan]], rows: int) -> BatchPlan:
    """Rows of several plans placed at their draw positions, padded to a common number of steps."""
    steps = max(p.num_steps for _, p in plans)
    width = plans[0][1].index.shape[2]
    device = plans[0][1].index.device
    index = torch.zeros(rows, steps, width, dtype=torch.int64, device=device)
    weight = torch.zeros(rows, steps, width, dtype=plans[0][1].weight.dtype, device=device)
    counts = torch.zeros(rows, dtype=torch.int64)
    clients = [0] * rows
    for positions, plan in plans:
        at = torch.as_tensor(positions, device=device)
        index[at, : plan.num_steps] = plan.index
        index[at, plan.num_steps :] = plan.index[:, :1]
        weight[at, : plan.num_steps] = plan.weight
        counts[torch.as_tensor(positions)] = plan.steps
        for p, c in zip(positions.tolist(), plan.clients, strict=True):
            clients[p] = c
    return BatchPlan(tuple(clients), index, weight, counts)


def limit_steps(plan: BatchPlan, limits: np.ndarray) -> BatchPlan:
    """``plan`` with row r cut to its first ``limits[r]`` steps (later steps become padding)."""
    limits_t = torch.as_tensor(limits, dtype=torch.int64)
    steps = torch.minimum(plan.steps, limits_t)
    keep = torch.arange(plan.num_steps)[None, :] < steps[:, None]
    weight = plan.weight * keep.to(plan.weight)[:, :, None]
    return BatchPlan(plan.clients, plan.index, weight, steps)


def round_plan(
    data: FederatedData,
    draws: Draws,
    round_: int,
    batch_size: int,
    epochs: int,
    steps: int | None,
    drop_last: bool,
) -> BatchPlan:
    """The local batches of every draw in round ``round_``: ``epochs`` passes, or exactly ``steps`` steps.

    For ``steps`` (the SplitFed theory paper's K) each client makes as many passes as it needs for K steps and
    stops after K; a client with no batch at all (fewer samples than the batch size under ``drop_last``)
    idles.
    """
    if steps is not None:
        sizes = data.client_sizes(draws.clients)
        per_epoch = sizes // batch_size if drop_last else -(-sizes // batch_size)
        epochs = max(math.ceil(steps / b) for b in per_epoch if b > 0) if per_epoch.any() else 1
    plans = []
    for k in range(int(draws.occurrence.max(initial=0)) + 1):
        positions = np.flatnonzero(draws.occurrence == k)
        purpose = "batches" if k == 0 else f"batches-repeat{k}"
        plan = data.batch_plan(
            draws.clients[positions].tolist(), round_, epochs, batch_size, drop_last, purpose
        )
        plans.append((positions, plan))
    plan = _stack(plans, len(draws))
    if steps is not None:
        plan = limit_steps(plan, np.full(len(draws), steps))
    return plan


def step_sizes(cfg: SplitConfig, t: int, num_clients: int) -> tuple[float, float]:
    """Client and server step sizes in round t (decayed; server optionally divided by m; the client's
    0 after ``freeze_client_after``, which keeps the server's objective fixed)."""
    decay = cfg.lr_decay ** ((t - 1) // cfg.lr_decay_every)
    server = (cfg.server_optimizer or cfg.optimizer).lr * decay
    if cfg.server_lr_divide_by_m:
        server /= num_clients
    frozen = cfg.freeze_client_after is not None and t > cfg.freeze_client_after
    return 0.0 if frozen else cfg.optimizer.lr * decay, server
