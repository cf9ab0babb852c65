"""Hand-written PyTorch loops of the family benchmarks: what a researcher writes without fedge.

Each loop keeps one ``nn.Module`` per client (and per server copy where the algorithm has copies), one
``torch.optim.SGD`` per module and round, and walks the clients in Python, with no needless copies or
device syncs. It starts from the fedge run's initial weights and reads the same batches (the run's
batch plans), so after one round its global model agrees with fedge's up to float reassociation, and it
counts the same work: client optimizer steps, server steps, aggregations.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from fedge.runner import Built

Tensors = dict[str, torch.Tensor]


def _state(module: nn.Module) -> Tensors:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@torch.no_grad()
def _load(module: nn.Module, state: Tensors) -> None:
    for name, value in module.state_dict().items():
        value.copy_(state[name])


@torch.no_grad()
def _average(modules: list[nn.Module], weights: torch.Tensor) -> Tensors:
    """The weighted average of the modules' state (weights sum to 1)."""
    states = [m.state_dict() for m in modules]
    out = {}
    for name, first in states[0].items():
        if not first.is_floating_point():
            out[name] = first.clone()
            continue
        total = torch.zeros_like(first)
        for w, state in zip(weights.tolist(), states, strict=True):
            total.add_(state[name], alpha=w)
        out[name] = total
    return out


class SplitLoop:
    """CSE-FSL (aux head, one shared server fed every ``h`` batches) or SplitFed v1 (server copies).

    Step order as in the papers' simulations: at local step s every client steps on its batch; for
    CSE-FSL the server then takes the uploads of that step one after another in client order.
    """

    def __init__(self, built: Built):
        alg, cfg = built.algorithm, built.config.algorithm
        self.data = built.context.data
        self.name = cfg.name
        self.aux = cfg.name == "cse_fsl"
        self.h = getattr(cfg, "h", 1) if self.aux else 1
        self.batch, self.epochs, self.lr = cfg.batch_size, cfg.local_epochs, cfg.optimizer.lr
        m = self.data.num_clients
        self.clients = [copy.deepcopy(alg.parts.local) for _ in range(m)]
        self.global_client = {**_clone(alg.client["params"]), **_clone(alg.client["buffers"])}
        server = copy.deepcopy(alg.parts.server)
        _load(server, {**alg.server.params, **alg.server.buffers})
        if self.aux:
            self.server = server
            self.server_opt = torch.optim.SGD(server.parameters(), lr=self.lr)
        else:
            self.global_server = _state(server)
            self.servers = [copy.deepcopy(server) for _ in range(m)]
        sizes = torch.as_tensor(self.data.client_sizes(), dtype=torch.float64)
        self.weights = sizes / sizes.sum()

    def round(self, t: int) -> None:
        data, m = self.data, len(self.clients)
        plan = data.batch_plan(list(range(m)), t, self.epochs, self.batch)
        counts = plan.weight.sum(-1).long().tolist()
        steps = plan.steps.tolist()
        for model in self.clients:
            _load(model, self.global_client)
        opts = [torch.optim.SGD(model.parameters(), lr=self.lr) for model in self.clients]
        if not self.aux:
            for server in self.servers:
                _load(server, self.global_server)
            server_opts = [torch.optim.SGD(s.parameters(), lr=self.lr) for s in self.servers]
        for s in range(plan.num_steps):
            uploads = []
            for c, (model, opt) in enumerate(zip(self.clients, opts, strict=True)):
                if s >= steps[c]:
                    continue
                idx = plan.index[c, s, : counts[c][s]]
                x, y = data.x_train[idx], data.y_train[idx]
                z = model.trunk(x)
                if self.aux:
                    loss = F.cross_entropy(model.aux(z), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    if (s + 1) % self.h == 0:
                        uploads.append((z.detach(), y))
                else:
                    cut = z.detach().requires_grad_(True)
                    loss = F.cross_entropy(self.servers[c](cut), y)
                    server_opts[c].zero_grad(set_to_none=True)
                    loss.backward()
                    server_opts[c].step()
                    opt.zero_grad(set_to_none=True)
                    z.backward(cut.grad)
                    opt.step()
            for z, y in uploads:
                loss = F.cross_entropy(self.server(z), y)
                self.server_opt.zero_grad(set_to_none=True)
                loss.backward()
                self.server_opt.step()
        self.global_client = _average(self.clients, self.weights)
        if not self.aux:
            self.global_server = _average(self.servers, self.weights)

    def state(self) -> Tensors:
        server = _state(self.server) if self.aux else self.global_server
        return {**{f"client.{k}": v for k, v in self.global_client.items()}, **_prefixed(server, "server.")}


def fedge_split_state(built: Built) -> Tensors:
    """The fedge split run's global client and server model, named as :meth:`SplitLoop.state`."""
    alg = built.algorithm
    client = {**alg.client["params"], **alg.client["buffers"]}
    return {
        **_prefixed(client, "client."),
        **_prefixed({**alg.server.params, **alg.server.buffers}, "server."),
    }


def _prefixed(tensors: Tensors, prefix: str) -> Tensors:
    return {prefix + k: v for k, v in tensors.items()}


def _clone(tensors: Tensors) -> Tensors:
    return {k: v.detach().clone() for k, v in tensors.items()}
