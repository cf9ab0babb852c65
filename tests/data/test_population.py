"""A lazily drawn client population: indices drawn per client on demand, the same every time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge.data.dataset import Dataset
from fedge.data.federated import FederatedData, ResampledClients


def test_a_resampled_population_draws_each_client_on_demand_and_repeatably():
    clients = ResampledClients(count=1_000_000, size=20, pool=50, seed=3)
    assert len(clients) == 1_000_000
    first, again, other = clients[999_999], clients[999_999], clients[5]
    assert first.shape == (20,) and first.min() >= 0 and first.max() < 50
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert np.array_equal(ResampledClients(1_000_000, 20, 50, 4)[5].shape, other.shape)
    assert not np.array_equal(ResampledClients(1_000_000, 20, 50, 4)[5], other)
    with pytest.raises(IndexError, match="population 1000000"):
        clients[1_000_000]


def test_federated_data_keeps_a_population_lazy_and_plans_its_batches():
    x, y = torch.randn(50, 1, 2, 2), torch.randint(0, 3, (50,))
    dataset = Dataset("t", x, y, x[:10], y[:10], 3)
    train = ResampledClients(10**6, 20, 50, 0)
    data = FederatedData(dataset, train, ResampledClients(10**6, 5, 10, 1), seed=0)
    assert data.client_train is train and data.num_clients == 10**6
    assert data.client_sizes([7, 123_456]).tolist() == [20, 20]
    plan = data.batch_plan([123_456], 1, 1, 8)
    assert plan.steps.tolist() == [3]
    real = plan.index[0][plan.weight[0] > 0]
    assert sorted(real.tolist()) == sorted(train[123_456].tolist())
