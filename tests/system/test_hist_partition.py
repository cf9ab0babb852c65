"""HIST partitions (Eqs. 3-7, App. B): layouts of the zoo, disjoint covering masks, merge, and the
narrow-submodel form of a cell's training equal to the masked-full-model form (Eq. 4-5, 7)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.aggregation import AnchoredMean, Updates
from fedge.algorithms.hierarchical.cost import values_mb
from fedge.algorithms.hierarchical.masks import (
    check_cells,
    draw_owners,
    layer_sizes,
    partition_layout,
    partitioned_names,
    uniform_owner_sizes,
)
from fedge.algorithms.hierarchical.submodel import CellViews
from fedge.algorithms.hierarchical.training import masked_step
from fedge.engine import SGD, classification_loss, make_step, parameters_of
from fedge.errors import ConfigError
from fedge.models import build_model, count_parameters

MNIST = (1, 28, 28)


def build(name: str, shape=MNIST, **options):
    torch.manual_seed(0)
    return build_model(name, shape, 10, **options)


def test_paper_models_sizes_and_layouts():
    fcnn, lenet = build("fcnn"), build("lenet5")
    assert count_parameters(fcnn) == 238_510
    assert count_parameters(lenet) == 44_426
    assert round(values_mb(238_510), 2) == 0.91
    assert round(values_mb(44_426), 3) == 0.169
    (layer,) = partition_layout(fcnn)
    assert (layer.producer, layer.consumer, layer.width, layer.values_per_neuron) == (
        "fc1.linear",
        "out.linear",
        300,
        795,
    )
    (layer,) = partition_layout(lenet)  # fc1 rows + fc2 columns; fc2 bias, out and convs shared
    assert (layer.producer, layer.consumer, layer.width) == ("fc1.linear", "fc2.linear", 120)
    shared = sum(p.numel() for n, p in lenet.named_parameters() if n not in partitioned_names((layer,)))
    assert shared == 2_572 + 84 + 850


@pytest.mark.parametrize(
    ("name", "shape", "options", "expected"),
    [
        ("mlp", (1, 8, 8), {"hidden": [32, 16, 8]}, [("fc1.linear", 32), ("fc3.linear", 8)]),
        ("cnn4", MNIST, {}, [("fc1.linear", 512)]),
        ("cse_cifar", (3, 24, 24), {}, [("fc1.linear", 384)]),
        ("cnn2", MNIST, {}, []),
        ("resnet18", (3, 8, 8), {"width": 4}, []),
    ],
)
def test_every_other_hidden_fc_layer_is_partitioned(name, shape, options, expected):
    layout = partition_layout(build(name, shape, **options))
    assert [(layer.producer, layer.width) for layer in layout] == expected


def test_random_partitions_are_disjoint_covering_and_redrawn():
    layout = partition_layout(build("fcnn"))
    sizes = uniform_owner_sizes(layout, 4)
    first = draw_owners(layout, sizes, np.random.default_rng(1))[0]
    second = draw_owners(layout, sizes, np.random.default_rng(2))[0]
    assert first.shape == (300,) and set(first) == {0, 1, 2, 3}  # every neuron exactly one owner
    assert np.bincount(first).tolist() == [75, 75, 75, 75]
    assert (first != second).mean() > 0.5
    uneven = draw_owners(layout, np.array([100, 50, 150]), np.random.default_rng(3))[0]
    assert np.bincount(uneven).tolist() == [100, 50, 150]


def test_further_layers_follow_the_first_layers_shares():
    layout = partition_layout(build("mlp", (1, 8, 8), hidden=[30, 16, 10]))
    sizes = layer_sizes(layout, np.array([10, 20]))
    assert [s.tolist() for s in sizes] == [[10, 20], [3, 7]]


def test_more_cells_than_neurons_is_a_config_error():
    with pytest.raises(ConfigError, match="algorithm.cells"):
        check_cells(partition_layout(build("mlp", (1, 8, 8), hidden=[4])), 5)


@pytest.mark.parametrize("form", ["compact", "masked"])
@pytest.mark.parametrize(
    ("name", "shape", "options"),
    [("fcnn", MNIST, {}), ("lenet5", MNIST, {}), ("mlp", (1, 8, 8), {"hidden": [32, 16, 8]})],
)
def test_merge_of_untouched_submodels_is_the_model_bit_exactly(form, name, shape, options):
    model = build(name, shape, **options)
    params = parameters_of(model)
    layout = partition_layout(model)
    sizes = uniform_owner_sizes(layout, 3) + np.array([1, 1, -2])  # uneven: compact form pads
    views = CellViews.build(layout, draw_owners(layout, sizes, np.random.default_rng(0)), 3, form)
    cells = views.gather(params)
    merged = views.merge(
        cells, lambda shared: AnchoredMean().reduce(Updates.of("cloud", 1, shared, torch.ones(3) / 3))
    )
    assert all(torch.equal(merged[k], params[k]) for k in params)
    shared = sum(p.numel() for k, p in params.items() if k not in partitioned_names(layout))
    assert views.values(params).sum() == sum(p.numel() for p in params.values()) + 2 * shared


def _data(shape, n=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=gen), torch.randint(0, 10, (n,), generator=gen)


@pytest.mark.parametrize(
    ("name", "shape", "options", "sizes"),
    [
        ("fcnn", MNIST, {}, [100, 150, 50]),
        ("lenet5", MNIST, {}, [40, 50, 30]),
        ("mlp", (1, 8, 8), {"hidden": [32, 16, 8]}, [20, 12]),
    ],
)
def test_narrow_submodel_training_equals_masked_full_model_training(name, shape, options, sizes):
    """Three SGD steps (momentum 0.9) of the smallest cell: a genuinely narrow network holding only its own
    neurons vs the full network with the other cells' neurons masked (Eq. 5). The masked result stays zero
    off the cell's submodel."""
    model = build(name, shape, **options)
    params = parameters_of(model)
    layout = partition_layout(model)
    owners = draw_owners(layout, np.array(sizes), np.random.default_rng(4))
    cell = int(np.argmin(sizes))
    compact = CellViews.build(layout, owners, len(sizes), "compact")
    masked = CellViews.build(layout, owners, len(sizes), "masked")
    narrow = compact.real(cell, {k: v[cell : cell + 1] for k, v in compact.gather(params).items()})
    narrow = {k: v[0] for k, v in narrow.items()}
    full = {k: v[cell] for k, v in masked.gather(params).items()}
    valid = {k: v[0] for k, v in masked.client_valid(torch.tensor([cell])).items()}
    sgd = SGD(momentum=0.9)
    plain = make_step(classification_loss(model), sgd)
    step = masked_step(plain, layout)
    state_n, state_f = sgd.init(narrow), {**sgd.init(full), **valid}
    x, y = _data(shape)
    weight = torch.ones(8)
    for s in range(3):
        xb, yb = x[8 * s : 8 * s + 8], y[8 * s : 8 * s + 8]
        narrow, _, state_n, loss_n = plain(narrow, {}, state_n, xb, yb, weight, 0.1)
        full, _, state_f, loss_f = step(full, {}, state_f, xb, yb, weight, 0.1)
        assert float(loss_n) == pytest.approx(float(loss_f), rel=1e-5)
    assert any(narrow[k].shape != full[k].shape for k in narrow)
    expected = masked.real(cell, {k: v[None] for k, v in full.items()})
    for k in narrow:
        torch.testing.assert_close(narrow[k], expected[k][0], rtol=1e-5, atol=1e-6)
    support = masked.gather({k: torch.ones_like(v) for k, v in params.items()})  # 1 on held slots
    assert all(torch.all(full[k][support[k][cell] == 0] == 0) for k in full)
    assert not torch.equal(full["fc1.linear.weight"], masked.gather(params)["fc1.linear.weight"][cell])
