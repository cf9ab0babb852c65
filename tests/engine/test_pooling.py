"""2 x 2 max pooling as maxima: PyTorch's max_pool2d bit for bit, and routed only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, vmap

from fedge.engine import pooling
from fedge.engine.kernels import batched_kernels
from fedge.engine.pooling import max_pool_2x2


def _input(kind: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(len(shape) + sum(shape))
    x = torch.randn(shape, generator=gen, dtype=dtype)
    if kind == "ties":  # many equal values in a window, as a blank background gives
        return (x * 1.5).round().clamp_min(0)
    return torch.zeros(shape, dtype=dtype) if kind == "zeros" else x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("kind", ["random", "ties", "zeros"])
@pytest.mark.parametrize("shape", [(4, 3, 8, 8), (2, 5, 9, 7), (3, 6, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_are_max_pool2d_bit_for_bit(kind, shape, dtype):
    x = _input(kind, shape, dtype)
    ours, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, expected = max_pool_2x2(ours), F.max_pool2d(theirs, 2)
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    out.backward(cotangent)
    expected.backward(cotangent)
    assert torch.equal(out, expected)  # equal values (a zero's sign may differ: max(-0, 0))
    assert torch.equal(_bits(ours.grad), _bits(theirs.grad))  # a tie's gradient goes to the first maximum
    with torch.no_grad():
        assert torch.equal(max_pool_2x2(x), F.max_pool2d(x, 2))


def test_under_vmap_grad_and_under_autograd_of_a_vmapped_forward():
    """The batched executor's two forms: vmap(grad(...)) for a step, autograd over vmap for split
    learning's client pullback."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(5, 3, 1, 3, 3, generator=gen), torch.randn(5, 4, 1, 13, 12, generator=gen).round()

    def loss(w_, x_, pool):
        return pool(F.conv2d(x_, w_)).square().sum()

    expected = vmap(grad(lambda w_, x_: loss(w_, x_, lambda t: F.max_pool2d(t, 2))))(w, x)
    assert torch.equal(vmap(grad(lambda w_, x_: loss(w_, x_, max_pool_2x2)))(w, x), expected)
    ours, theirs = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
    vmap(lambda w_, x_: loss(w_, x_, max_pool_2x2))(ours, x).sum().backward()
    vmap(lambda w_, x_: loss(w_, x_, lambda t: F.max_pool2d(t, 2)))(theirs, x).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)


def test_a_nan_in_a_window_gives_nan_as_pytorch_does():
    x = torch.zeros(1, 1, 4, 4)
    x[0, 0, 1, 0] = float("nan")
    out = max_pool_2x2(x.requires_grad_(True))
    assert torch.isnan(out[0, 0, 0, 0]) and torch.equal(out[0, 0, 1], torch.zeros(2))


@pytest.mark.parametrize(
    ("layer", "routed"),
    [
        (nn.MaxPool2d(2), True),
        (nn.MaxPool2d((2, 2), stride=2), True),
        (nn.MaxPool2d(3, stride=2, padding=1), False),
        (nn.MaxPool2d(2, stride=1), False),
        (nn.MaxPool2d(2, ceil_mode=True), False),
        (nn.MaxPool2d(2, dilation=2), False),
    ],
)
def test_batched_kernels_route_only_the_2x2_stride_2_pooling(monkeypatch, layer, routed):
    calls = []
    real = pooling.max_pool_2x2
    monkeypatch.setattr(pooling, "max_pool_2x2", lambda x: calls.append(x.shape) or real(x))
    x = torch.randn(3, 2, 4, 8, 8)
    with batched_kernels():
        out = vmap(layer)(x)
    assert torch.equal(out, vmap(layer)(x))
    assert len(calls) == int(routed)


def test_batched_kernels_leave_other_devices_and_returned_indices_to_pytorch(monkeypatch):
    calls = []
    monkeypatch.setattr(pooling, "max_pool_2x2", lambda x: calls.append(x) or x)
    with batched_kernels():
        out = F.max_pool2d(torch.randn(2, 3, 8, 8, device="meta"), 2)  # meta stands in for CUDA
        _, index = F.max_pool2d(torch.randn(2, 3, 8, 8), 2, return_indices=True)
    assert out.shape == (2, 3, 4, 4) and index.dtype == torch.int64 and not calls
