"""Executors: how a group of clients runs its local steps.

``SequentialExecutor`` is the reference: one client after another, each step on the client's real
batch. ``BatchedExecutor`` runs the same pure step under ``torch.func.vmap`` over all clients at once,
gathering every client's batch with one indexing operation per step; clients with fewer steps (or a
short last batch) are padded and their padded steps masked out. Same plan, same step, same numbers up to
floating-point reassociation.

Random layers (dropout) draw from torch's global generator, which the caller seeds per round from the
run seed; with vmap the draws are made per client (``randomness="different"``), so runs are
reproducible per executor but dropout masks differ between the two executors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch.func import vmap

from fedge.data.federated import BatchPlan, FederatedData
from fedge.engine.bank import ClientBank, row
from fedge.engine.step import StepFn


class Executor(ABC):
    """Runs the local steps of a plan for every client of a bank; returns the mean loss per client."""

    name: str

    @abstractmethod
    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        """Update ``bank`` in place by the steps of ``plan``; return each client's mean training loss."""


class SequentialExecutor(Executor):
    """Reference executor: a Python loop over clients and their real batches."""

    name = "sequential"

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        losses = torch.zeros(len(bank), device=data.device)
        rows = []
        for r in range(len(bank)):
            params, buffers = bank.client(r)
            opt_state = row(bank.opt_state, r)
            total = torch.zeros((), device=data.device)
            steps = int(plan.steps[r])
            for s in range(steps):
                idx = plan.client_batch(r, s)
                x, y = data.x_train[idx], data.y_train[idx]
                weight = torch.ones(len(idx), device=data.device)
                params, buffers, opt_state, loss = step(params, buffers, opt_state, x, y, weight, lr)
                total = total + loss
            losses[r] = total / max(steps, 1)
            rows.append((params, buffers, opt_state))
        for attr, position in (("params", 0), ("buffers", 1), ("opt_state", 2)):
            stacked = getattr(bank, attr)
            for name in stacked:
                stacked[name] = torch.stack([state[position][name] for state in rows])
        return losses


def _select(active: torch.Tensor, new: dict, old: dict) -> dict:
    """Keep ``new`` where a client's step is real and ``old`` where it is padding."""
    out = {}
    for name, value in new.items():
        mask = active.reshape(-1, *([1] * (value.dim() - 1)))
        out[name] = torch.where(mask, value, old[name])
    return out


class BatchedExecutor(Executor):
    """All clients step together under ``vmap``; padded steps are masked."""

    name = "batched"

    def train(
        self, step: StepFn, bank: ClientBank, plan: BatchPlan, data: FederatedData, lr: float
    ) -> torch.Tensor:
        vstep = vmap(step, in_dims=(0, 0, 0, 0, 0, 0, None), randomness="different")
        steps = plan.steps.to(data.device)
        params, buffers, opt_state = bank.params, bank.buffers, bank.opt_state
        total = torch.zeros(len(bank), device=data.device)
        for s in range(plan.num_steps):
            idx = plan.index[:, s]
            x, y, weight = data.x_train[idx], data.y_train[idx], plan.weight[:, s]
            new_params, new_buffers, new_state, loss = vstep(params, buffers, opt_state, x, y, weight, lr)
            active = steps > s
            params = _select(active, new_params, params)
            buffers = _select(active, new_buffers, buffers)
            opt_state = _select(active, new_state, opt_state)
            total = total + torch.where(active, loss, torch.zeros_like(loss))
        bank.params, bank.buffers, bank.opt_state = params, buffers, opt_state
        return total / steps.clamp_min(1).to(total.dtype)


EXECUTORS: dict[str, type[Executor]] = {"sequential": SequentialExecutor, "batched": BatchedExecutor}


def make_executor(name: str) -> Executor:
    """The executor registered as ``name``."""
    return EXECUTORS[name]()
