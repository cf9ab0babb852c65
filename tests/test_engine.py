"""The engine: batch plans, SGD semantics, and the two executors agreeing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.engine import (
    SGD,
    BatchedExecutor,
    ClientBank,
    SequentialExecutor,
    buffers_of,
    classification_loss,
    make_step,
    parameters_of,
)


def make_data(sizes: list[int], shape=(1, 6, 6), classes=3, seed=0) -> FederatedData:
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, *shape, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    dataset = Dataset("t", x, y, x[:10], y[:10], classes)
    bounds = np.cumsum([0, *sizes])
    train = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return FederatedData(dataset, train, [np.arange(10)] * len(sizes), seed=1)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 12), nn.ReLU(), nn.Linear(12, 3))


def bn_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))


def train_both(model, data, sgd, epochs=2, batch=8, drop_last=False, lr=0.1):
    clients = list(range(data.num_clients))
    plan = data.batch_plan(clients, 1, epochs, batch, drop_last)
    step = make_step(classification_loss(model), sgd)
    params, buffers = parameters_of(model), buffers_of(model)
    banks = []
    for executor in (SequentialExecutor(), BatchedExecutor()):
        bank = ClientBank.broadcast(clients, params, buffers, sgd.init(params))
        losses = executor.train(step, bank, plan, data, lr)
        banks.append((bank, losses))
    return banks


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].detach().double() - b[k].detach().double()).abs().max()) for k in a)


def test_batch_plan_covers_each_client_once_per_epoch():
    data = make_data([5, 11, 8])
    plan = data.batch_plan([0, 1, 2], round_=2, epochs=2, batch_size=4)
    assert plan.steps.tolist() == [4, 6, 4]
    for row, client in enumerate(plan.clients):
        seen = torch.cat([plan.client_batch(row, s) for s in range(int(plan.steps[row]))]).numpy()
        expected = np.concatenate([data.client_train[client]] * 2)
        assert sorted(seen) == sorted(expected)
    assert plan.weight[0, 4:].sum() == 0 and plan.weight[0, 1].sum() == 1  # 5 = 4 + 1, then padding


def test_batch_plan_is_independent_of_group():
    data = make_data([7, 9, 6])
    together = data.batch_plan([0, 1, 2], 3, 1, 4)
    alone = data.batch_plan([1], 3, 1, 4)
    assert torch.equal(together.index[1, :3], alone.index[0])
    other_round = data.batch_plan([1], 4, 1, 4)
    assert not torch.equal(other_round.index, alone.index)


def test_sgd_matches_torch_optim():
    model = mlp()
    reference = mlp()
    data = make_data([40])
    sgd = SGD(momentum=0.9, weight_decay=0.01)
    step = make_step(classification_loss(model), sgd)
    params, buffers = parameters_of(model), buffers_of(model)
    state = sgd.init(params)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    for s in range(4):
        idx = torch.arange(s * 10, s * 10 + 10)
        x, y = data.x_train[idx], data.y_train[idx]
        params, buffers, state, _ = step(params, buffers, state, x, y, torch.ones(10), 0.05)
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        opt.step()
    assert max_diff(params, dict(reference.named_parameters())) < 1e-6


@pytest.mark.parametrize("sgd", [SGD(), SGD(momentum=0.9, weight_decay=5e-4)])
def test_executors_agree_with_unequal_clients(sgd):
    data = make_data([13, 40, 7, 25])
    (seq, seq_loss), (bat, bat_loss) = train_both(mlp(), data, sgd)
    assert max_diff(seq.params, bat.params) < 1e-5
    assert max_diff(seq.opt_state, bat.opt_state) < 1e-5 if sgd.momentum else not seq.opt_state
    assert torch.allclose(seq_loss, bat_loss, atol=1e-5)
    assert max_diff(seq.params, ClientBank.broadcast([0], parameters_of(mlp()), {}).params) > 1e-3


def test_executors_agree_with_batchnorm_buffers():
    data = make_data([16, 32, 24])
    (seq, _), (bat, _) = train_both(bn_cnn(), data, SGD(momentum=0.5), batch=8, drop_last=True)
    assert max_diff(seq.params, bat.params) < 1e-5
    assert max_diff(seq.buffers, bat.buffers) < 1e-5
    assert seq.buffers["1.num_batches_tracked"].tolist() == [4, 8, 6]
    means = seq.buffers["1.running_mean"]
    assert not torch.allclose(means[0], means[1])  # each client keeps its own statistics


def test_bank_average_is_sample_weighted():
    bank = ClientBank.broadcast([0, 1], {"w": torch.zeros(2)}, {"n": torch.tensor(0)})
    bank.params["w"] = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    bank.buffers["n"] = torch.tensor([3, 5])
    params, buffers = bank.average(torch.tensor([0.25, 0.75]))
    assert params["w"].tolist() == [2.5, 5.0] and int(buffers["n"]) == 5
