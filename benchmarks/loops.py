"""Hand-written PyTorch loops of the family benchmarks: what a researcher writes without fedge.

Each loop keeps one ``nn.Module`` per client (and per server copy where the algorithm has copies), one
``torch.optim.SGD`` per module and round, and walks the clients in Python, with no needless copies or
device syncs. It starts from the fedge run's initial weights and reads the same batches (the run's
batch plans), so after one round its global model agrees with fedge's up to float reassociation, and it
counts the same work: client optimizer steps, server steps, aggregations.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedge.algorithms.hierarchical.masks import draw_owners, uniform_owner_sizes
from fedge.algorithms.hierarchical.training import local_steps_plan
from fedge.rng import numpy_rng
from fedge.runner.loop import Built

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


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _epochs(model, opt, data, plan, row: int, counts: list[list[int]], steps: int) -> None:
    """Client row ``row``'s local steps of ``plan`` (its real rows only)."""
    for s in range(steps):
        idx = plan.index[row, s, : counts[row][s]]
        _step(model, opt, data.x_train[idx], data.y_train[idx])


class GossipLoop:
    """Gossip learning: every client trains its own model, then averages it with ``peers`` random
    neighbours' trained models (the peers drawn by the run's own seeded sampler)."""

    def __init__(self, built: Built):
        alg, cfg = built.algorithm, built.config.algorithm
        self.alg, self.data = alg, built.context.data
        self.epochs, self.batch = cfg.local_epochs, cfg.batch_size
        self.opt = cfg.optimizer
        initial = {**_clone(alg.bank.params), **_clone(alg.bank.buffers)}
        self.clients = [copy.deepcopy(alg.model) for _ in range(alg.num_clients)]
        for c, model in enumerate(self.clients):
            _load(model, {k: v[c] for k, v in initial.items()})

    def round(self, t: int) -> None:
        n, data, opt = len(self.clients), self.data, self.opt
        plan = data.batch_plan(list(range(n)), t, self.epochs, self.batch)
        counts, steps = plan.weight.sum(-1).long().tolist(), plan.steps.tolist()
        for c, model in enumerate(self.clients):
            sgd = torch.optim.SGD(
                model.parameters(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay
            )
            _epochs(model, sgd, data, plan, c, counts, steps[c])
        chosen = self.alg.random_peers(t)
        trained = [m.state_dict() for m in self.clients]
        new = []
        with torch.no_grad():
            for i in range(n):
                group = [i, *(j for j in chosen[i].nonzero()[0].tolist() if j != i)]
                new.append({k: torch.stack([trained[j][k] for j in group]).mean(0) for k in trained[i]})
            for model, state in zip(self.clients, new, strict=True):
                _load(model, state)

    def state(self) -> Tensors:
        states = [m.state_dict() for m in self.clients]
        return {k: torch.stack([s[k] for s in states]) for k in states[0]}


def fedge_bank_state(built: Built) -> Tensors:
    """Every client's model of a decentralized fedge run, stacked (as :meth:`GossipLoop.state`)."""
    bank = built.algorithm.bank
    return {**bank.params, **bank.buffers}


class HierarchicalLoop:
    """HFedAvg: ``E`` edge rounds of ``H`` local steps per client, a plain mean per cell after each, and
    the cloud's plain mean of the cells after the ``E``-th (the run's own per-step batch plans)."""

    def __init__(self, built: Built):
        from fedge.algorithms.hierarchical.training import local_steps_plan

        alg, cfg = built.algorithm, built.config.algorithm
        self.alg, self.cfg, self.plan = alg, cfg, local_steps_plan
        self.clients = [copy.deepcopy(alg.model) for _ in range(alg.cells.size)]
        self.global_ = {**_clone(alg.params), **_clone(alg.buffers)}

    def round(self, t: int) -> None:
        alg, cfg, cells = self.alg, self.cfg, self.alg.cells
        cell_models = [self.global_] * cells.num_cells
        uniform = torch.full((cells.per_cell,), 1.0 / cells.per_cell, dtype=torch.float64)
        for e in range(cfg.edge_rounds):
            plan = self.plan(alg.data, tuple(range(cells.size)), t, e, cfg.local_steps, cfg.batch_size)
            counts, steps = plan.weight.sum(-1).long().tolist(), plan.steps.tolist()
            for c, model in enumerate(self.clients):
                _load(model, cell_models[c // cells.per_cell])
                sgd = torch.optim.SGD(model.parameters(), lr=cfg.optimizer.lr)
                _epochs(model, sgd, alg.data, plan, c, counts, steps[c])
            cell_models = [
                _average(self.clients[j * cells.per_cell : (j + 1) * cells.per_cell], uniform)
                for j in range(cells.num_cells)
            ]
        weights = torch.full((cells.num_cells,), 1.0 / cells.num_cells, dtype=torch.float64)
        self.global_ = {
            k: sum(w * m[k] for w, m in zip(weights.tolist(), cell_models, strict=True)) for k in self.global_
        }

    def state(self) -> Tensors:
        return self.global_


def fedge_global_state(built: Built) -> Tensors:
    """The global model of a hierarchical fedge run."""
    alg = built.algorithm
    return {**alg.params, **alg.buffers}


def _dense(fan_in: int, width: int, fan_out: int) -> nn.Sequential:
    """A cell's submodel as a small dense net: flatten, ``fan_in -> width``, ReLU, ``width -> fan_out``."""
    return nn.Sequential(nn.Flatten(), nn.Linear(fan_in, width), nn.ReLU(), nn.Linear(width, fan_out))


class HistLoop:
    """HIST on a one-hidden-layer FCNN: each round the hidden units are split at random into ``N`` disjoint
    groups (the run's own seeded draw), every client of cell ``j`` trains a dense ``fan_in -> s_j -> fan_out``
    net holding only cell ``j``'s units, ``E`` edge rounds of ``H`` steps with a plain mean per cell after
    each; the cloud writes each cell's units back and averages what no unit owns (the output bias).

    Uniform mask sizes, OMA with fp32 links and no dropout: what W7 runs.
    """

    def __init__(self, built: Built):
        alg, cfg = built.algorithm, built.config.algorithm
        if len(alg.layout) != 1 or cfg.mask_sizes != "uniform" or cfg.aggregation != "oma":
            raise ValueError("HistLoop covers one hidden layer, uniform mask sizes and OMA")
        if cfg.optimizer.kind != "sgd" or any(isinstance(m, nn.Dropout) for m in alg.model.modules()):
            raise ValueError("HistLoop trains with plain SGD and no dropout")
        layer = alg.layout[0]
        self.names = (*layer.rows, layer.column, layer.consumer + ".bias")
        if set(alg.params) != set(self.names) or alg.buffers:
            raise ValueError(f"HistLoop expects exactly the parameters {self.names}")
        self.alg, self.cfg, self.layer = alg, cfg, layer
        self.sizes = uniform_owner_sizes(alg.layout, alg.cells.num_cells)
        per_cell = alg.cells.per_cell
        self.clients = [
            _dense(layer.fan_in, int(self.sizes[c // per_cell]), layer.fan_out).to(alg.ctx.device)
            for c in range(alg.cells.size)
        ]
        self.global_ = _clone(alg.params)

    def _groups(self, t: int) -> list[torch.Tensor]:
        """Each cell's hidden units in round ``t`` (sorted ids), from the run's seeded permutation."""
        alg = self.alg
        owner = draw_owners(alg.layout, self.sizes, numpy_rng(alg.ctx.seed, "hist-masks", t))[0]
        ids = [np.flatnonzero(owner == j) for j in range(alg.cells.num_cells)]
        return [torch.as_tensor(group, device=alg.ctx.device) for group in ids]

    def round(self, t: int) -> None:
        alg, cfg, cells, opt = self.alg, self.cfg, self.alg.cells, self.cfg.optimizer
        w1, b1, w2, b2 = (self.global_[k] for k in self.names)
        groups = self._groups(t)
        cell_models = [
            {"1.weight": w1[ids], "1.bias": b1[ids], "3.weight": w2[:, ids], "3.bias": b2} for ids in groups
        ]
        uniform = torch.full((cells.per_cell,), 1.0 / cells.per_cell, dtype=torch.float64)
        for e in range(cfg.edge_rounds):
            plan = local_steps_plan(alg.data, tuple(range(cells.size)), t, e, cfg.local_steps, cfg.batch_size)
            counts, steps = plan.weight.sum(-1).long().tolist(), plan.steps.tolist()
            for c, model in enumerate(self.clients):
                _load(model, cell_models[c // cells.per_cell])
                sgd = torch.optim.SGD(
                    model.parameters(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay
                )
                _epochs(model, sgd, alg.data, plan, c, counts, steps[c])
            cell_models = [
                _average(self.clients[j * cells.per_cell : (j + 1) * cells.per_cell], uniform)
                for j in range(cells.num_cells)
            ]
        w1, b1, w2 = torch.empty_like(w1), torch.empty_like(b1), torch.empty_like(w2)
        for ids, cell in zip(groups, cell_models, strict=True):
            w1[ids], b1[ids], w2[:, ids] = cell["1.weight"], cell["1.bias"], cell["3.weight"]
        b2 = torch.stack([cell["3.bias"] for cell in cell_models]).mean(0)
        self.global_ = dict(zip(self.names, (w1, b1, w2, b2), strict=True))

    def state(self) -> Tensors:
        return self.global_


_AFIND_SETTINGS = {  # what AfindLoop implements (W6 runs these, all AFIND+ defaults)
    "neighbor_mode": "literal",
    "selection": "threshold",
    "aggregation": "boltzmann",
    "p_update": "full",
    "proxy": "gradient",
    "entropy_set": "coreset",
    "entropy_reduce": "sum",
    "normalize": "sigmoid",
    "confidence_direction": "literal",
    "dp": None,
    "personal": "none",
    "local_update": "joint",
    "codec_model": "fp32",
}


class AfindLoop:
    """AFIND+ (literal mode, W6's settings): per-client modules, probed and trained one pair at a time.

    Each round every client ``i`` takes, at its current model, the gradient of the proxy layer on its own
    probe batch and on each neighbour ``k``'s (the run's probe batches), scores ``sim[i, k]`` = cosine,
    ``p[i] = softmax(sim[i] / upsilon)`` over its neighbours, and picks the coreset: the top ``k0`` in the
    first round, then every ``k`` with ``p[i, k] >= theta_i`` (top ``k_min`` if none). A copy of ``i``'s model
    is trained on each chosen neighbour's data and ``i``'s own on its own (the run's batch plans); ``i``
    mixes them with Boltzmann weights of the smoothed losses ``(1 - gamma) post + gamma pre`` on the data
    holder's probe batch, itself included. ``theta`` for the next round follows from the coreset's
    similarities (``tau (1 - sigmoid(h))``, ``h`` the entropy of ``(sim + 1) / 2``).
    """

    def __init__(self, built: Built):
        alg, cfg = built.algorithm, built.config.algorithm
        unsupported = {k: v for k, v in _AFIND_SETTINGS.items() if getattr(cfg, k) != v}
        if unsupported or cfg.optimizer.kind != "sgd" or not cfg.include_self:
            raise ValueError(f"AfindLoop covers W6's AFIND+ settings only, not {unsupported}")
        self.alg, self.cfg, self.data = alg, cfg, alg.train_data
        initial = {**_clone(alg.bank.params), **_clone(alg.bank.buffers)}
        self.clients = [copy.deepcopy(alg.model) for _ in range(alg.num_clients)]
        for c, model in enumerate(self.clients):
            _load(model, {k: v[c] for k, v in initial.items()})
        self.workers: list[nn.Module] = []  # models a requester's copies train in, reused every round
        self.proxy = alg.selector.prober.proxy_names  # the run's proxy layer (the featurizer's last Linear)
        n, device = alg.num_clients, alg.ctx.device  # the selection's tensors live beside the models
        self.available = alg.neighbours.to(device)
        self.sim = torch.zeros(n, n, dtype=torch.float64, device=device)
        self.theta = torch.full((n,), cfg.tau / 2, dtype=torch.float64, device=device)
        self.started = False

    def _probe(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The proxy layer's gradient of ``model``'s loss on a probe batch, and the loss."""
        params = dict(model.named_parameters())
        loss = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, [params[k] for k in self.proxy])
        return torch.cat([g.reshape(-1) for g in grads]), loss.detach()

    def _select(self, p: torch.Tensor) -> torch.Tensor:
        """The coreset ``[n, n]``: top ``k0`` first, then ``p >= theta`` (top ``k_min`` where none is)."""
        available, cfg = self.available, self.cfg
        masked = p.masked_fill(~available, -torch.inf)
        ranks = torch.argsort(torch.argsort(-masked, dim=1, stable=True), dim=1)  # ties: lower index first
        if not self.started:
            return available & (ranks < cfg.k0)
        chosen = available & (p >= self.theta[:, None])
        empty = ~chosen.any(dim=1) & available.any(dim=1)
        return torch.where(empty[:, None], available & (ranks < cfg.k_min), chosen)

    def round(self, t: int) -> None:
        cfg, data, n = self.cfg, self.data, len(self.clients)
        batches = self.alg.probes(t)
        sizes = batches.weight.sum(dim=1).long().tolist()
        probe = [
            (data.x_train[batches.index[k, :m]], data.y_train[batches.index[k, :m]])
            for k, m in enumerate(sizes)
        ]
        pre = torch.full((n, n), torch.nan, dtype=torch.float64, device=self.sim.device)
        for i, model in enumerate(self.clients):
            model.eval()
            mine, pre[i, i] = self._probe(model, *probe[i])
            ks = self.available[i].nonzero()[:, 0]
            if len(ks):
                theirs, losses = zip(*(self._probe(model, *probe[k]) for k in ks.tolist()), strict=True)
                theirs = torch.stack(theirs)
                norms = theirs.norm(dim=1).double() * mine.norm().double()
                self.sim[i, ks] = ((theirs @ mine).double() / norms.clamp_min(1e-30)).clamp(-1.0, 1.0)
                pre[i, ks] = torch.stack(losses).double()
        p = torch.softmax((self.sim / cfg.upsilon).masked_fill(~self.available, -torch.inf), dim=1)
        chosen = self._select(p.nan_to_num(0.0))
        plan = data.batch_plan(list(range(n)), t, cfg.local_epochs, cfg.batch_size, cfg.drop_last)
        counts, steps = plan.weight.sum(-1).long().tolist(), plan.steps.tolist()
        opt = cfg.optimizer
        for i, model in enumerate(self.clients):
            group = [i, *chosen[i].nonzero()[:, 0].tolist()]  # its own data, then each chosen holder's
            while len(self.workers) < len(group):
                self.workers.append(copy.deepcopy(model))
            post = []
            for worker, j in zip(self.workers, group, strict=False):
                _load(worker, model.state_dict())
                worker.train()
                sgd = torch.optim.SGD(
                    worker.parameters(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay
                )
                _epochs(worker, sgd, data, plan, j, counts, steps[j])
                worker.eval()
                with torch.no_grad():
                    post.append(F.cross_entropy(worker(probe[j][0]), probe[j][1]))
            smoothed = (1.0 - cfg.gamma) * torch.stack(post).double() + cfg.gamma * pre[i, group]
            weights = torch.softmax(-smoothed / cfg.t_agg, dim=0)
            _load(model, _average(self.workers[: len(group)], weights))
            model.train()
        e = ((self.sim + 1.0) / 2.0).clamp(1e-8, 1.0 - 1e-8)
        h = torch.where(chosen, -e * torch.log(e), torch.zeros_like(e)).sum(dim=1)
        self.theta = cfg.tau * (1.0 - torch.sigmoid(h))
        self.started = True

    def state(self) -> Tensors:
        states = [m.state_dict() for m in self.clients]
        return {k: torch.stack([s[k] for s in states]) for k in states[0]}
