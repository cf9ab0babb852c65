"""Participation draws, aggregation weights and round plans of the split family (SplitFed theory)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.algorithms.split.participation import aggregation_weights, draw
from fedge.algorithms.split.plans import limit_steps, round_plan
from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData
from fedge.errors import ConfigError


def test_full_participation_is_every_client_in_order():
    d = draw(0, 1, 4, "full", None, "independent")
    assert d.clients.tolist() == [0, 1, 2, 3] and d.occurrence.tolist() == [0, 0, 0, 0]


def test_sampling_is_seeded_per_round_and_marks_repeats():
    a = draw(7, 3, 5, "with_replacement", 12, "independent")
    assert np.array_equal(a.clients, draw(7, 3, 5, "with_replacement", 12, "independent").clients)
    assert not np.array_equal(a.clients, draw(7, 4, 5, "with_replacement", 12, "independent").clients)
    for r, c in enumerate(a.clients):
        assert a.occurrence[r] == np.sum(a.clients[:r] == c)
    merged = draw(7, 3, 5, "with_replacement", 12, "merge")
    assert merged.multiplicity.sum() == 12 and len(set(merged.clients)) == len(merged.clients)
    distinct = draw(7, 3, 5, "without_replacement", 5, "independent")
    assert sorted(distinct.clients.tolist()) == [0, 1, 2, 3, 4]


def test_aggregation_weights_by_size_uniform_and_the_literal_divisor():
    d = draw(0, 1, 3, "full", None, "independent")
    sizes = np.array([10, 30, 60])
    assert aggregation_weights(d, sizes, "size", "draws", 3).tolist() == [0.1, 0.3, 0.6]
    assert aggregation_weights(d, sizes, "uniform", "draws", 3).tolist() == pytest.approx([1 / 3] * 3)
    assert aggregation_weights(d, sizes, "uniform", "all_clients", 10).tolist() == pytest.approx([0.1] * 3)
    with pytest.raises(ConfigError, match="algorithm.aggregate_divisor"):
        aggregation_weights(d, sizes, "size", "all_clients", 10)


def _data(sizes: list[int]) -> FederatedData:
    n = sum(sizes)
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
    bounds = np.cumsum([0, *sizes])
    train = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    dataset = Dataset("t", x, torch.zeros(n, dtype=torch.int64), x[:2], torch.zeros(2, dtype=torch.int64), 2)
    return FederatedData(dataset, train, [np.arange(2)] * len(sizes), seed=3)


def test_repeated_draws_get_their_own_batch_order():
    data = _data([20, 20])
    d = draw(0, 1, 2, "full", None, "independent")
    d = type(d)(np.array([1, 0, 1]), np.array([0, 0, 1]), np.ones(3, dtype=np.int64))
    plan = round_plan(data, d, round_=2, batch_size=5, epochs=1, steps=None, drop_last=False)
    assert plan.clients == (1, 0, 1)
    assert not torch.equal(plan.index[0], plan.index[2])  # the second draw of client 1 differs
    assert torch.equal(plan.index[0], data.batch_plan([1], 2, 1, 5).index[0])  # first draw: usual stream


def test_exactly_k_local_steps_span_epochs_and_stop():
    data = _data([12, 30])
    d = draw(0, 1, 2, "full", None, "independent")
    plan = round_plan(data, d, round_=1, batch_size=5, epochs=1, steps=7, drop_last=False)
    assert plan.steps.tolist() == [7, 7]
    assert plan.weight[0].sum() == 5 + 5 + 2 + 5 + 5 + 2 + 5  # client 0 wraps into its third pass
    cut = limit_steps(plan, np.array([3, 7]))
    assert cut.steps.tolist() == [3, 7] and float(cut.weight[0, 3:].sum()) == 0.0
