"""Topologies of decentralized FL: shape, symmetry, degrees, connectivity, determinism and errors."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.algorithms.decentralized.topology import TopologyConfig, build_topology, is_connected
from fedge.errors import ConfigError


def graph(n: int, seed: int = 0, **kw) -> np.ndarray:
    return build_topology(TopologyConfig(**kw), n, seed)


@pytest.mark.parametrize(
    "kw",
    [{"kind": "full"}, {"kind": "ring"}, {"kind": "partial", "p": 0.3}, {"kind": "regular", "degree": 3}],
)
def test_simple_undirected_connected(kw):
    a = graph(12, **kw)
    assert a.shape == (12, 12) and a.dtype == bool
    assert (a == a.T).all() and not a.diagonal().any()
    assert is_connected(a)


def test_degrees_of_full_ring_and_regular():
    assert (graph(7, kind="full").sum(1) == 6).all()
    assert (graph(7, kind="ring").sum(1) == 2).all()
    for n, k in [(10, 3), (11, 4), (30, 7)]:
        assert (graph(n, kind="regular", degree=k).sum(1) == k).all()


def test_partial_density_follows_p_and_seed():
    a = graph(100, kind="partial", p=0.5)
    assert abs(a.sum() / (100 * 99) - 0.5) < 0.03
    assert (graph(100, kind="partial", p=0.5) == a).all()
    assert (graph(100, seed=1, kind="partial", p=0.5) != a).any()


def test_regular_is_randomised_not_the_circulant():
    a, b = graph(20, kind="regular", degree=4), graph(20, seed=5, kind="regular", degree=4)
    ring_like = all(a[i, (i + 1) % 20] for i in range(20))
    assert not ring_like and (a != b).any()


def test_connectivity_check():
    two_islands = np.zeros((4, 4), dtype=bool)
    two_islands[0, 1] = two_islands[1, 0] = two_islands[2, 3] = two_islands[3, 2] = True
    assert not is_connected(two_islands)
    assert is_connected(np.zeros((1, 1), dtype=bool))


def test_partial_gives_up_with_a_message_naming_p():
    with pytest.raises(ConfigError, match=r"algorithm\.topology\.p"):
        graph(60, kind="partial", p=0.01, max_retries=3)


@pytest.mark.parametrize(("n", "k"), [(5, 5), (7, 3)])
def test_impossible_regular_graphs_name_the_degree(n, k):
    with pytest.raises(ConfigError, match=r"algorithm\.topology\.degree"):
        graph(n, kind="regular", degree=k)
