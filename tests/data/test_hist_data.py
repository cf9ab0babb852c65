"""Cells and the paper's two data splits (Sec. VI-A) plus the authors' code's global shards, on
Fashion-MNIST-shaped labels."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.algorithms.hierarchical.cells import cell_iid, fully_noniid, global_shards
from fedge.errors import ConfigError
from fedge.runtime.hierarchy import Cells


def fmnist_labels(seed: int = 0) -> np.ndarray:
    """60,000 labels, 6,000 per class, in random order (the shape of Fashion-MNIST's training set)."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(10), 6000))


def test_cells_are_contiguous_and_leave_the_remainder_idle():
    cells = Cells.even(60, 8)
    assert (cells.per_cell, cells.size) == (7, 56)
    assert cells.members(1).tolist() == list(range(7, 14))
    assert cells.cell_of[:8].tolist() == [0] * 7 + [1]
    assert Cells.even(60, 4).groups(2).tolist() == [0, 0, 1, 1]
    with pytest.raises(ConfigError, match="algorithm.cells"):
        Cells.even(3, 4)


def test_global_shards_give_each_client_two_label_shards():
    labels = fmnist_labels()
    parts = global_shards(labels, 60, 2, np.random.default_rng(1))
    assert [len(p) for p in parts] == [1000] * 60
    assert max(len(np.unique(labels[p])) for p in parts) <= 2
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined) == 60_000


def _classes_per_cell(labels: np.ndarray, cells: int, seed: int) -> float:
    parts = global_shards(labels, 60, 2, np.random.default_rng(seed))
    per_cell = 60 // cells
    return np.mean(
        [
            len(np.unique(labels[np.concatenate(parts[j * per_cell : (j + 1) * per_cell])]))
            for j in range(cells)
        ]
    )


def test_global_shards_cells_see_nearly_every_class():
    labels = fmnist_labels()
    coverage = [np.mean([_classes_per_cell(labels, n, s) for s in range(5)]) for n in (2, 4, 6, 10)]
    assert coverage == sorted(coverage, reverse=True)
    assert coverage[0] > 9.5 and coverage[-1] < 8.0


def _cell_classes(labels: np.ndarray, cells: Cells, parts: list[np.ndarray]) -> list[set[int]]:
    return [set(np.unique(labels[np.concatenate([parts[c] for c in cells.members(j)])]).tolist())
            for j in range(cells.num_cells)]  # fmt: skip


@pytest.mark.parametrize(
    ("n", "expected"),
    [(2, [5, 5]), (4, [3, 3, 2, 2]), (6, [2, 2, 2, 2, 1, 1]), (8, [2, 2, 1, 1, 1, 1, 1, 1])],
)
def test_fully_noniid_cells_own_disjoint_classes_that_shrink_with_n(n: int, expected: list[int]):
    labels = fmnist_labels()
    cells = Cells.even(60, n)
    parts = fully_noniid(labels, cells, 2, np.random.default_rng(3))
    owned = _cell_classes(labels, cells, parts)
    assert [len(c) for c in owned] == expected
    assert set().union(*owned) == set(range(10)) and sum(len(c) for c in owned) == 10  # disjoint
    assert owned[0] == set(range(expected[0]))  # contiguous ranges in label order
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)  # no sample twice
    clients = [len(np.unique(labels[p])) for p in parts]
    assert max(clients) <= 2  # clients within a cell are skewed: two single-class shards at most


def test_fully_noniid_needs_no_more_cells_than_classes():
    with pytest.raises(ConfigError, match="algorithm.cells"):
        fully_noniid(fmnist_labels(), Cells.even(60, 12), 2, np.random.default_rng(0))


def test_cell_iid_cells_look_alike_and_clients_are_skewed():
    labels = fmnist_labels()
    cells = Cells.even(60, 4)
    parts = cell_iid(labels, cells, 2, np.random.default_rng(2))
    assert [len(p) for p in parts] == [1000] * 60
    for j in range(4):
        counts = np.bincount(labels[np.concatenate([parts[c] for c in cells.members(j)])], minlength=10)
        assert counts.min() > 0.85 * counts.max()
    classes = np.array([len(np.unique(labels[p])) for p in parts])
    assert classes.max() <= 4  # two shards, each may straddle one class boundary inside the cell
    assert classes.mean() < 3.0
