"""The fused dense kernel: which models take it, and that it trains as autograd does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedge.engine import (
    SGD,
    Adam,
    BatchedExecutor,
    ClientBank,
    SequentialExecutor,
    classification_loss,
    make_step,
)
from fedge.engine.dense import DenseKernel, Flatten, Linear, Relu, dense_kernel, dense_layers
from fedge.engine.step import buffers_of, cross_entropy, parameters_of
from fedge.models.cnn import build_lenet5
from fedge.models.mlp import build_fcnn, build_mlp
from tests.engine.test_engine import make_data, max_diff


def test_fedge_dense_models_are_chains_named_like_their_parameters():
    model = build_mlp((1, 6, 6), 3, hidden=(12, 5))
    layers = dense_layers(model)
    assert layers == (
        Flatten(),
        Linear("fc1.linear.weight", "fc1.linear.bias"),
        Relu(),
        Linear("fc2.linear.weight", "fc2.linear.bias"),
        Relu(),
        Linear("out.linear.weight", "out.linear.bias"),
    )
    names = {name for name, _ in model.named_parameters()}
    assert names == {n for layer in layers if isinstance(layer, Linear) for n in (layer.weight, layer.bias)}
    assert dense_layers(build_fcnn((1, 28, 28), 10)) is not None


class Doubled(nn.Sequential):
    def forward(self, x):  # not the sequential forward: must not be read as a chain
        return 2 * super().forward(x)


@pytest.mark.parametrize(
    "model",
    [
        build_lenet5((1, 28, 28), 10),
        build_fcnn((1, 28, 28), 10, dropout=0.5),
        nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)),
        nn.Sequential(nn.Flatten(), nn.Linear(36, 8), nn.Tanh(), nn.Linear(8, 3)),
        Doubled(nn.Flatten(), nn.Linear(36, 3)),
        nn.Sequential(nn.Flatten(), nn.ReLU()),
    ],
    ids=["lenet5", "dropout", "batchnorm", "tanh", "own-forward", "no-linear"],
)
def test_other_models_are_left_to_autograd(model):
    assert dense_layers(model) is None


def mlp(bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(36, 12, bias=bias),
        nn.ReLU(),
        nn.Dropout(0.0),
        nn.Linear(12, 7),
        nn.ReLU(),
        nn.Linear(7, 3),
    )


def test_kernel_is_chosen_for_cross_entropy_on_every_parameter():
    model = mlp()
    names = [name for name, _ in model.named_parameters()]
    sgd_step = make_step(classification_loss(model), SGD(momentum=0.9))
    assert dense_kernel(sgd_step, (1, 6, 6), names).fused  # the update inside the products
    adam = dense_kernel(make_step(classification_loss(model), Adam()), (1, 6, 6), names)
    assert isinstance(adam, DenseKernel) and not adam.fused  # gradients in scratch buffers, then Adam
    squared = classification_loss(model, lambda logits, y: (logits**2).sum(-1))
    assert dense_kernel(make_step(squared, SGD()), (1, 6, 6), names) is None
    assert dense_kernel(sgd_step, (1, 6, 6), names[:-2]) is None  # a head trained alone
    no_flatten = nn.Sequential(nn.Linear(36, 3))
    flat = [name for name, _ in no_flatten.named_parameters()]
    assert dense_kernel(make_step(classification_loss(no_flatten), SGD()), (36,), flat) is not None
    assert dense_kernel(make_step(classification_loss(no_flatten), SGD()), (1, 6, 6), flat) is None


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "optimizer",
    [SGD(), SGD(momentum=0.9), SGD(weight_decay=0.01), SGD(0.5, 0.01), Adam(), Adam(weight_decay=0.01)],
)
def test_fused_training_agrees_with_autograd_and_the_sequential_executor(optimizer, bias):
    model = mlp(bias)
    data = make_data([11, 24, 7, 16])  # unequal clients: short batches and finished clients
    clients = list(range(data.num_clients))
    plan = data.batch_plan(clients, 1, 2, 8)
    step = make_step(classification_loss(model), optimizer)
    params, buffers = parameters_of(model), buffers_of(model)
    results = {}
    executors = {
        "sequential": SequentialExecutor(),
        "autograd": BatchedExecutor(fused=False),
        "fused": BatchedExecutor(chunk_clients=3),
    }
    for name, executor in executors.items():
        bank = ClientBank.broadcast(clients, params, buffers, optimizer.init(params))
        tensors = dict(bank.params)
        results[name] = (bank, executor.train(step, bank, plan, data, 0.1))
        if name == "fused":
            assert all(bank.params[k] is tensors[k] for k in tensors)  # trained in place
    fused, fused_loss = results["fused"]
    # Adam divides each coordinate by the root of its second moment, which magnifies the GEMMs' rounding:
    # on an AVX-512 Xeon the parameters differ by 1.7e-6 after 4 steps, on an AMD EPYC by less than 1e-6
    tolerance = 1e-5 if isinstance(optimizer, Adam) else 1e-6
    for name in ("sequential", "autograd"):
        bank, loss = results[name]
        assert max_diff(bank.params, fused.params) < tolerance
        if bank.opt_state:
            assert max_diff(bank.opt_state, fused.opt_state) < tolerance
        assert torch.allclose(loss, fused_loss, atol=1e-6)
    moved = max_diff(fused.params, {k: v.expand_as(fused.params[k]) for k, v in params.items()})
    assert moved > 1e-2  # it trained


def test_config_switch_reaches_the_executor():
    from fedge.api import resolve_config
    from fedge.runner.loop import build_run

    raw = {
        "rounds": 1,
        "data": {"name": "synthetic", "num_train": 120, "num_test": 40, "shape": [1, 6, 6], "num_classes": 3},
        "partition": {"kind": "iid", "num_clients": 4},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "algorithm": {"name": "fedavg", "batch_size": 10},
        "output": {"plots": False},
    }
    assert build_run(resolve_config(raw, [])).context.executor.fused
    assert not build_run(resolve_config(raw, ["engine.fused=false"])).context.executor.fused


def test_the_batched_executor_trains_a_dense_step_with_the_kernel_in_one_chunk():
    model = mlp()
    data = make_data([11, 24, 7, 16])
    clients = list(range(data.num_clients))
    plan = data.batch_plan(clients, 1, 1, 8)
    params = parameters_of(model)
    bank = ClientBank.broadcast(clients, params, {}, {})
    step = make_step(classification_loss(model), SGD())
    kernel = BatchedExecutor()._kernel(step, False, (1, 6, 6), params)
    assert isinstance(kernel, DenseKernel)
    assert BatchedExecutor(chunk_bytes=1).chunk_size(bank, plan, data, kernel) == 4  # no gradient to bound
    assert not isinstance(BatchedExecutor(fused=False)._kernel(step, False, (1, 6, 6), params), DenseKernel)


def test_gradients_for_other_optimizers_reuse_the_first_steps_buffers():
    model = mlp()
    params = {k: v.expand(4, *v.shape).clone() for k, v in parameters_of(model).items()}
    adam = Adam()
    state = adam.init(params, rows=4)
    kernel = dense_kernel(make_step(classification_loss(model), adam), (1, 6, 6), params)
    x, y, weight = torch.randn(4, 5, 1, 6, 6), torch.randint(0, 3, (4, 5)), torch.ones(4, 5)
    kernel(params, {}, state, x, y, weight, 0.1, None)
    held = {name: t.data_ptr() for name, t in kernel.scratch.items()}
    assert held.keys() == params.keys()
    prefix = {k: v[:2] for k, v in params.items()}
    kernel(prefix, {}, {k: v[:2] for k, v in state.items()}, x[:2], y[:2], weight[:2], 0.1, None)
    assert {name: t.data_ptr() for name, t in kernel.scratch.items()} == held  # no new gradient
    assert state["step"].tolist() == [2.0, 2.0, 1.0, 1.0]


@pytest.mark.parametrize("optimizer", [SGD(momentum=0.9, weight_decay=0.01), Adam()])
def test_a_dense_shared_split_server_steps_by_the_kernel_as_autograd_does(optimizer):
    from fedge.algorithms.split.server import CutBatch, SharedServer

    torch.manual_seed(0)
    server = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    params = parameters_of(server)
    generator = torch.Generator().manual_seed(1)
    batches = [
        CutBatch(None, torch.randn(3, 5, 3, 2, 2, generator=generator), torch.randint(0, 3, (3, 5)), counts)
        for counts in (torch.tensor([5, 2, 0]), torch.tensor([4, 5, 5]))
    ]
    answers = {}
    for fused in (False, True):
        shared = SharedServer(server, params, {}, optimizer, None, fused=fused)
        answers[fused] = [shared.serve(batch, 0.1, True, [2, 0, 1]) for batch in batches], shared
    (autograd, reference), (kernel, shared) = answers[False], answers[True]
    assert isinstance(shared.dense.by_shape[(3, 2, 2)], DenseKernel)  # the kernel served
    for a, b in zip(autograd, kernel, strict=True):
        assert torch.allclose(a.loss, b.loss, atol=1e-6) and torch.allclose(a.grad_z, b.grad_z, atol=1e-7)
    assert max_diff(reference.params, shared.params) < 1e-6
    assert max_diff(reference.opt_state, shared.opt_state) < 1e-6
    assert max_diff(params, shared.params) > 1e-3  # it trained, on its own copies
    assert float(kernel[0].grad_z[2].abs().sum()) == 0.0  # a row that sent nothing gets nothing


@pytest.mark.parametrize("optimizer", [SGD(momentum=0.9, weight_decay=0.01), Adam()])
@pytest.mark.parametrize("shard", [None, (1, 3, 4)])
def test_dense_server_copies_step_by_the_kernel_as_the_executors_map_does(optimizer, shard):
    """SplitFed v1's copies: the sending rows step together; a row that sends nothing keeps its copy
    and gets nothing; a process's share of the rows (``shard``) updates only those copies."""
    from fedge.algorithms.split.copies import ServerCopies
    from fedge.algorithms.split.server import CutBatch

    torch.manual_seed(0)
    server = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    params = parameters_of(server)
    rows = None if shard is None else torch.tensor(shard)
    count = 3 if shard is None else len(shard)
    generator = torch.Generator().manual_seed(1)
    z, y = torch.randn(count, 5, 3, 2, 2, generator=generator), torch.randint(0, 3, (count, 5))
    batches = [CutBatch(rows, z, y, n) for n in (torch.tensor([5, 2, 0]), torch.tensor([4, 5, 5]))]
    answers = {}
    for fused in (False, True):
        copies = ServerCopies(server, params, {}, optimizer, None, BatchedExecutor(), fused=fused)
        copies.begin(5 if shard else count)
        answers[fused] = [copies.serve(batch, 0.1, True, []) for batch in batches], copies
    (autograd, reference), (kernel, fused_copies) = answers[False], answers[True]
    assert isinstance(fused_copies.dense.by_shape[(3, 2, 2)], DenseKernel)
    for a, b in zip(autograd, kernel, strict=True):
        assert torch.allclose(a.loss, b.loss, atol=1e-6) and torch.allclose(a.grad_z, b.grad_z, atol=1e-7)
    for ours, theirs in zip(fused_copies.copies, reference.copies, strict=True):
        assert not ours or max_diff(ours, theirs) < 1e-6  # (no buffers)
    assert float(kernel[0].loss[2]) == 0.0 and float(kernel[0].grad_z[2].abs().sum()) == 0.0
    trained = [0, 1, 2] if shard is None else list(shard)
    untouched = [r for r in range(5 if shard else count) if r not in trained]
    stepped = fused_copies.copies[0]
    for name, start in params.items():
        assert all(torch.equal(stepped[name][r], start) for r in untouched)
        assert not torch.equal(stepped[name][trained[0]], start)


def test_a_server_with_anything_but_flatten_before_its_first_linear_keeps_autograd():
    from fedge.engine.dense import server_kernel

    relu_first = nn.Sequential(nn.Flatten(), nn.ReLU(), nn.Linear(12, 3))
    assert server_kernel(relu_first, SGD(), cross_entropy, (3, 2, 2)) is None
    convolutional = nn.Sequential(nn.Conv2d(3, 2, 1), nn.Flatten(), nn.Linear(8, 3))
    assert server_kernel(convolutional, SGD(), cross_entropy, (3, 2, 2)) is None
    assert server_kernel(nn.Sequential(nn.Flatten(), nn.Linear(12, 3)), SGD(), cross_entropy, (3, 2, 2))
