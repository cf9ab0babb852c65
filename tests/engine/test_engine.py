"""The engine: batch plans, SGD semantics, and the two executors agreeing."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from fedge.config import parse_config
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
from fedge.engine.convolution import PerClientConv2d
from fedge.engine.host import available_cores, configure_host, retain_freed_memory
from fedge.engine.kernels import batched_kernels
from fedge.errors import ConfigError
from fedge.runner.loop import build_run


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


def train_both(model, data, sgd, epochs=2, batch=8, drop_last=False, lr=0.1, batched=None, wrap=False):
    clients = list(range(data.num_clients))
    plan = data.batch_plan(clients, 1, epochs, batch, drop_last)
    step = make_step(classification_loss(model), sgd)
    if wrap:  # a plain step function, not a Step: the batched executor's generic path

        def plain(*args):
            return step(*args)

    params, buffers = parameters_of(model), buffers_of(model)
    banks = []
    for executor in (SequentialExecutor(), batched or BatchedExecutor()):
        bank = ClientBank.broadcast(clients, params, buffers, sgd.init(params))
        losses = executor.train(plain if wrap else step, bank, plan, data, lr)
        banks.append((bank, losses))
    return banks


def assert_agree(seq: ClientBank, bat: ClientBank, seq_loss: torch.Tensor, bat_loss: torch.Tensor) -> None:
    for field in ("params", "buffers", "opt_state"):
        a, b = getattr(seq, field), getattr(bat, field)
        assert a.keys() == b.keys()
        if a:
            assert max_diff(a, b) < 1e-5, field
    assert torch.allclose(seq_loss, bat_loss, atol=1e-5)


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


def test_weighted_sum_averages_floats_and_keeps_the_largest_counter():
    from fedge.engine import weighted_sum

    params = {"w": torch.tensor([[1.0, 2.0], [3.0, 6.0]])}
    buffers = {"n": torch.tensor([3, 5])}
    weights = torch.tensor([0.25, 0.75])
    assert weighted_sum(params, weights)["w"].tolist() == [2.5, 5.0]
    assert int(weighted_sum(buffers, weights)["n"]) == 5


UNEQUAL = [13, 40, 7, 25, 32, 9]  # step counts out of order: the batched executor reorders rows


@pytest.mark.parametrize("chunk", [None, 2, 4])
@pytest.mark.parametrize("wrap", [False, True])
def test_batched_chunks_agree_with_momentum_and_weight_decay(chunk, wrap):
    data = make_data(UNEQUAL)
    sgd = SGD(momentum=0.9, weight_decay=5e-4)
    executor = BatchedExecutor(chunk_clients=chunk)
    (seq, seq_loss), (bat, bat_loss) = train_both(mlp(), data, sgd, batched=executor, wrap=wrap)
    assert_agree(seq, bat, seq_loss, bat_loss)
    assert float(seq.opt_state["3.weight"].abs().max()) > 1e-3  # momentum buffers really move


@pytest.mark.parametrize("chunk", [None, 2])
def test_batched_chunks_agree_with_batchnorm_and_momentum(chunk):
    data = make_data(UNEQUAL[:5])
    sgd = SGD(momentum=0.5, weight_decay=1e-3)
    executor = BatchedExecutor(chunk_clients=chunk)
    (seq, seq_loss), (bat, bat_loss) = train_both(
        bn_cnn(), data, sgd, batch=4, drop_last=True, batched=executor
    )
    assert_agree(seq, bat, seq_loss, bat_loss)
    assert bat.buffers["1.num_batches_tracked"].tolist() == [6, 20, 2, 12, 16]


def test_chunk_size_gives_equal_chunks_within_the_gradient_budget():
    data = make_data([10] * 8)
    params = parameters_of(mlp())
    bank = ClientBank.broadcast(range(8), params, {})
    plan = data.batch_plan(range(8), 1, 1, 4)
    grads = 4 * sum(p.numel() for p in params.values())
    assert BatchedExecutor(chunk_bytes=3 * grads).chunk_size(bank, plan, data) == 3  # 3 + 3 + 2
    assert BatchedExecutor(chunk_bytes=5 * grads).chunk_size(bank, plan, data) == 4  # 4 + 4, not 5 + 3
    assert BatchedExecutor(chunk_bytes=8 * grads).chunk_size(bank, plan, data) == 8
    assert BatchedExecutor(chunk_bytes=1).chunk_size(bank, plan, data) == 1
    assert BatchedExecutor(chunk_clients=5).chunk_size(bank, plan, data) == 5


@pytest.mark.parametrize("executor", [SequentialExecutor(), BatchedExecutor(chunk_clients=2)])
def test_owned_banks_train_in_place_and_others_are_left_untouched(executor):
    data = make_data([9, 14, 5])
    model = mlp()
    sgd = SGD(momentum=0.9)
    step = make_step(classification_loss(model), sgd)
    params = parameters_of(model)
    owned = ClientBank.broadcast(range(3), params, {}, sgd.init(params))
    held = {k: v.clone() for k, v in owned.params.items()}
    borrowed = ClientBank(owned.clients, dict(held), {}, sgd.init(owned.params))
    tensors = dict(owned.params)
    plan = data.batch_plan(range(3), 1, 1, 4)
    executor.train(step, owned, plan, data, 0.1)
    executor.train(step, borrowed, plan, data, 0.1)
    assert all(owned.params[k] is tensors[k] for k in tensors)  # updated in place
    assert all(torch.equal(borrowed.params[k], owned.params[k]) for k in tensors)
    assert max_diff(held, borrowed.params) > 1e-3
    assert all(torch.equal(held[k], ClientBank.broadcast(range(3), params, {}).params[k]) for k in held)


def test_a_bank_holds_new_tensors_only_with_a_stated_ownership():
    bank = ClientBank.broadcast([0, 1], {"w": torch.zeros(2)}, {})
    assert bank.owned
    shared = {"w": torch.ones(2, 2)}
    bank.adopt(shared, owned=False)
    assert not bank.owned and bank.params is shared and bank.buffers == {}
    assert not ClientBank((0,), {"w": torch.zeros(1, 2)}).owned
    assert bank.state_bytes() == 2 * 2 * 4
    restored = ClientBank((0, 1), {})
    restored.load_state_dict(bank.state_dict())
    assert restored.owned and torch.equal(restored.params["w"], shared["w"])


@pytest.mark.parametrize("sgd", [SGD(), SGD(momentum=0.9), SGD(momentum=0.5, weight_decay=0.1)])
def test_sgd_update_in_place_is_bit_identical_to_the_pure_update(sgd):
    gen = torch.Generator().manual_seed(0)
    params = {"a": torch.randn(3, 4, generator=gen), "b": torch.randn(3, generator=gen)}
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
    state = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()} if sgd.momentum else {}
    new_params, new_state = sgd.update(params, grads, state, 0.1)
    sgd.update_(params, {k: g.clone() for k, g in grads.items()}, state, 0.1)
    assert all(torch.equal(params[k], new_params[k]) for k in params)  # bit-identical
    assert state.keys() == new_state.keys() and all(torch.equal(state[k], new_state[k]) for k in state)


@pytest.mark.slow
@pytest.mark.parametrize("build", [mlp, bn_cnn])
def test_compiled_batched_step_agrees(build):
    data = make_data([16, 32, 24])
    executor = BatchedExecutor(compile_step=True)
    (seq, seq_loss), (bat, bat_loss) = train_both(
        build(), data, SGD(momentum=0.9), drop_last=True, batched=executor
    )
    assert_agree(seq, bat, seq_loss, bat_loss)


CONV_OPTIONS = [{}, {"stride": 2, "padding": 1}, {"stride": (1, 2), "padding": (2, 0), "dilation": 2}]


def _conv_loss(w, b, x, options):
    """A conv -> ReLU -> max-pool loss of one client's weights ``w``, ``b`` and batch ``x``."""
    y = nn.functional.conv2d(x, w, b, **options)
    return nn.functional.max_pool2d(torch.relu(y), 2).square().sum()


@pytest.mark.parametrize("options", CONV_OPTIONS)
def test_per_client_conv_under_vmap_is_each_clients_own_convolution(options):
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(3, 4, 2, 3, 3, generator=gen), torch.randn(3, 4, generator=gen)
    x = torch.randn(3, 5, 2, 12, 11, generator=gen)
    with batched_kernels():
        got = vmap(grad(_conv_loss, argnums=(0, 1, 2)), in_dims=(0, 0, 0, None))(w, b, x, options)
    for c in range(3):  # plain autograd on one client: the sequential executor's computation, bit for bit
        leaves = [t[c].clone().requires_grad_(True) for t in (w, b, x)]
        expected = torch.autograd.grad(_conv_loss(*leaves, options), leaves)
        for g, e in zip(got, expected, strict=True):
            assert torch.equal(g[c], e)


def test_per_client_conv_inside_vjp_and_with_shared_weights():
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(4, 3, 1, 5, 5, generator=gen), torch.randn(4, 6, 1, 10, 10, generator=gen)

    def smashed(weights):
        return vmap(lambda w_, x_: torch.relu(nn.functional.conv2d(x_, w_)))(weights, x)

    expected, pullback = torch.func.vjp(smashed, w)
    with batched_kernels():
        got, got_pullback = torch.func.vjp(smashed, w)
        shared = vmap(lambda x_: nn.functional.conv2d(x_, w[0]))(x)  # one weight for every client
        same = nn.functional.conv2d(x[0], w[0], padding="same")  # string padding: runs unchanged
    cotangent = torch.randn(expected.shape, generator=gen)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(got_pullback(cotangent)[0], pullback(cotangent)[0], rtol=1e-5, atol=1e-4)
    assert torch.equal(shared, nn.functional.conv2d(x.flatten(0, 1), w[0]).unflatten(0, (4, 6)))
    assert torch.equal(same, nn.functional.conv2d(x[0], w[0], padding="same"))


def test_per_client_conv_leaves_other_devices_to_pytorchs_grouped_rule(monkeypatch):
    """Only CPU convolutions run one per client; elsewhere (meta stands in for CUDA) PyTorch's rule stays."""
    calls = []
    monkeypatch.setattr(PerClientConv2d, "apply", lambda *args: calls.append(args) or torch.zeros(1))
    w, x = torch.randn(4, 3, 1, 5, 5, device="meta"), torch.randn(4, 6, 1, 10, 10, device="meta")
    with batched_kernels():
        out = vmap(lambda w_, x_: nn.functional.conv2d(x_, w_))(w, x)
        vmap(lambda w_, x_: nn.functional.conv2d(x_, w_))(torch.zeros(w.shape), torch.zeros(x.shape))
    assert out.shape == (4, 6, 3, 6, 6) and out.device.type == "meta"
    assert len(calls) == 1 and calls[0][0].device.type == "cpu"


def test_compile_is_refused_for_the_sequential_executor(tiny_config):
    tiny_config["engine"] = {"executor": "sequential", "compile": True}
    with pytest.raises(ConfigError) as error:
        build_run(parse_config(tiny_config))
    assert error.value.key == "engine.compile"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is a glibc call")
def test_host_settings_apply_threads_and_the_allocator_switch():
    before = torch.get_num_threads()
    try:
        configure_host(threads=1, retain_memory=False)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert retain_freed_memory()
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


def dropout_mlp(p: float = 0.5) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 3))


def test_dropout_draws_the_same_keyed_masks_on_both_executors():
    from fedge.engine import NoiseStreams

    data = make_data([17, 9, 23, 12])
    model = dropout_mlp()
    params = parameters_of(model)
    sgd = SGD(momentum=0.9)
    step = make_step(classification_loss(model), sgd)
    plan = data.batch_plan(range(4), 1, 2, 5)
    trained = []
    for executor in (SequentialExecutor(), BatchedExecutor(chunk_clients=3)):
        executor.noise = NoiseStreams(seed=7, device=torch.device("cpu"))
        executor.noise.open("train", 1)
        bank = ClientBank.broadcast(range(4), params, {}, sgd.init(params))
        model.train()
        executor.train(step, bank, plan, data, 0.1)
        trained.append(bank.params)
    assert max_diff(trained[0], trained[1]) < 1e-6
    without = ClientBank.broadcast(range(4), params, {}, sgd.init(params))
    SequentialExecutor().train(step, without, plan, data, 0.1)  # torch's own dropout: other masks
    assert max_diff(trained[0], without.params) > 1e-3


def test_keyed_dropout_drops_its_share_and_differs_by_client_step_and_layer():
    from fedge.engine.noise import NoiseStreams, keyed_noise

    streams = NoiseStreams(seed=3, device=torch.device("cpu"))
    streams.open("train", 1)
    keys = streams.next_phase([0, 1, 1])
    assert len(set(keys.base.tolist())) == 3  # a repeated client gets a key of its own
    x = torch.ones(4000)
    with keyed_noise(keys.at(0)[0]):
        a, b = torch.nn.functional.dropout(x, 0.3), torch.nn.functional.dropout(x, 0.3)
    with keyed_noise(keys.at(0)[0]):
        again = torch.nn.functional.dropout(x, 0.3)
    with keyed_noise(keys.at(1)[0]):
        next_step = torch.nn.functional.dropout(x, 0.3)
    assert torch.equal(a, again)  # a pure function of the key and the layer's place
    assert abs(float((a == 0).float().mean()) - 0.3) < 0.03
    assert torch.allclose(a[a != 0], torch.full_like(a[a != 0], 1 / 0.7))
    assert not torch.equal(a, b) and not torch.equal(a, next_step)
    with keyed_noise(keys.at(0)[0]):
        assert torch.equal(torch.nn.functional.dropout(x, 0.3, training=False), x)


def test_the_sequential_executor_names_the_client_and_step_that_failed():
    from fedge.engine import ClientFailed

    data = make_data([8, 8, 8])
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 3))
    params = parameters_of(model)
    base = make_step(classification_loss(model), SGD())

    data.x_train[torch.as_tensor(data.client_train[2])] = 1e6  # only client 2's samples trip the step

    def failing(params, buffers, opt_state, x, y, weight, lr):
        if float(x.max()) > 1e5:
            raise FloatingPointError("boom")
        return base(params, buffers, opt_state, x, y, weight, lr)

    bank = ClientBank(tuple(range(3)), {k: v.expand(3, *v.shape).clone() for k, v in params.items()})
    plan = data.batch_plan(range(3), 1, 1, 4)
    with pytest.raises(ClientFailed, match=r"client 2, local step 0: FloatingPointError: boom"):
        SequentialExecutor().train(failing, bank, plan, data, 0.1)


@pytest.mark.parametrize("model_fn", [mlp, bn_cnn])
def test_the_sequential_executor_steps_in_place_with_the_pure_steps_numbers(model_fn):
    data = make_data([13, 20])
    model = model_fn()
    sgd = SGD(momentum=0.9, weight_decay=1e-3)
    step = make_step(classification_loss(model), sgd)
    params, buffers = parameters_of(model), buffers_of(model)
    plan = data.batch_plan([0, 1], 1, 2, 8)
    banks = []
    for fn in (step, lambda *args: step(*args)):  # a Step (plain autograd, in place) and a pure function
        bank = ClientBank.broadcast([0, 1], params, buffers, sgd.init(params))
        banks.append((bank, SequentialExecutor().train(fn, bank, plan, data, 0.1)))
    (eager, eager_loss), (pure, pure_loss) = banks
    for field in ("params", "buffers", "opt_state"):
        a, b = getattr(eager, field), getattr(pure, field)
        assert all(torch.equal(a[k], b[k]) for k in a), field
    assert torch.equal(eager_loss, pure_loss)
    assert max_diff(params, {k: v[0] for k, v in eager.params.items()}) > 1e-3


def test_without_the_allocator_switch_chunks_stay_within_reused_blocks(monkeypatch):
    from fedge.engine import executors

    data = make_data([10] * 8)
    params = parameters_of(mlp())
    bank = ClientBank.broadcast(range(8), params, {})
    plan = data.batch_plan(range(8), 1, 1, 4)
    grads = 4 * sum(p.numel() for p in params.values())
    monkeypatch.setattr(executors, "REUSED_BLOCK_BYTES", 2 * grads)
    monkeypatch.setattr(executors, "retaining_memory", lambda: False)
    assert BatchedExecutor(chunk_bytes=8 * grads).chunk_size(bank, plan, data) == 2
    monkeypatch.setattr(executors, "retaining_memory", lambda: True)
    assert BatchedExecutor(chunk_bytes=8 * grads).chunk_size(bank, plan, data) == 8


def test_call_at_is_functional_call_and_restores_the_module():
    from torch.func import functional_call

    from fedge.engine.bind import call_at

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    tensors = {k: v.detach().clone() + 1 for k, v in model.state_dict().items()}
    twin = {k: v.clone() for k, v in tensors.items()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 4)
    assert torch.equal(call_at(model, tensors, (x,)), functional_call(model, twin, (x,)))
    assert torch.equal(tensors["1.running_mean"], twin["1.running_mean"])  # BatchNorm's update landed here
    assert not torch.equal(tensors["1.running_mean"], before["1.running_mean"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the module is untouched
    with pytest.raises(RuntimeError):
        call_at(model, tensors, (torch.randn(5, 7),))  # a failing call still puts the module back
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    tied = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    tied[1].weight = tied[0].weight  # tied weights: functional_call's own handling
    weight = {"0.weight": torch.eye(3) * 2}
    assert torch.equal(call_at(tied, weight, (torch.ones(1, 3),)), torch.full((1, 3), 4.0))


def test_per_client_conv_under_autograd_of_a_vmapped_forward_takes_no_client_by_index():
    """Split learning's client pullback is autograd over a vmapped forward: taking a client's tensors by
    index would record a select whose backward zero-fills a whole stack per client."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    w = torch.randn(4, 3, 1, 5, 5, requires_grad=True)
    x = torch.randn(4, 6, 1, 10, 10)
    with batched_kernels():
        z = vmap(lambda w_, x_: nn.functional.conv2d(x_, w_))(w, x)
    ops = Ops()
    with ops:
        (g,) = torch.autograd.grad(z, w, torch.ones_like(z))
    plain = vmap(lambda w_, x_: nn.functional.conv2d(x_, w_))(w, x)  # PyTorch's grouped rule
    (expected,) = torch.autograd.grad(plain, w, torch.ones_like(plain))
    assert torch.allclose(g, expected, rtol=1e-5, atol=1e-5)
    assert not any(name.startswith("select_backward") for name in ops.names)
