"""Partitioners: coverage, determinism, label skew, per-client test sets and the errors people see."""

from __future__ import annotations

import numpy as np
import pytest

from fedge import config
from fedge.config import PartitionConfig
from fedge.data.partition import PARTITIONERS, partition_test, partition_train
from fedge.errors import ConfigError

NUM_CLASSES = 10


def balanced_labels(per_class: int = 200, num_classes: int = NUM_CLASSES, seed: int = 0) -> np.ndarray:
    """``per_class`` samples of each class, in random order."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def split(labels: np.ndarray, seed: int = 0, groups: np.ndarray | None = None, **kw) -> list[np.ndarray]:
    return partition_train(labels, PartitionConfig(**kw), np.random.default_rng(seed), groups)


def label_entropy(labels: np.ndarray) -> float:
    p = np.bincount(labels, minlength=NUM_CLASSES) / len(labels)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_descriptions_cover_every_configurable_kind():
    assert set(PARTITIONERS) == set(config.PARTITIONERS)


@pytest.mark.parametrize(
    "kw",
    [
        {"kind": "iid"},
        {"kind": "dirichlet", "alpha": 0.3},
        {"kind": "shards", "shards_per_client": 3},
    ],
)
def test_disjoint_and_covering(kw):
    labels = balanced_labels()
    parts = split(labels, num_clients=7, **kw)
    assert len(parts) == 7
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)  # sorted, no repeats
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


def test_iid_sizes_within_one_and_mixed():
    parts = split(balanced_labels(), num_clients=9, kind="iid")
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert min(np.unique(balanced_labels()[p]).size for p in parts) == NUM_CLASSES


GROUPS = np.repeat(np.arange(12), 50)


@pytest.mark.parametrize(
    "kw",
    [
        {"kind": "iid"},
        {"kind": "dirichlet"},
        {"kind": "pathological", "classes_per_client": 3},
        {"kind": "shards"},
        {"kind": "natural", "num_clients": 5},
    ],
)
def test_same_seed_same_split_other_seed_differs(kw):
    labels = balanced_labels(per_class=60)
    groups = GROUPS if kw["kind"] == "natural" else None
    first = split(labels, seed=3, groups=groups, **kw)
    again = split(labels, seed=3, groups=groups, **kw)
    other = split(labels, seed=4, groups=groups, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_pathological_exact_classes_balanced_use_and_even_split():
    labels = balanced_labels()
    parts = split(labels, num_clients=7, kind="pathological", classes_per_client=3)
    held = [np.unique(labels[p]) for p in parts]
    assert all(len(h) == 3 for h in held)
    # 7 * 3 = 21 class slots over 10 classes: each class held by 2 or 3 clients.
    holders = np.bincount(np.concatenate(held), minlength=NUM_CLASSES)
    assert holders.min() == 2 and holders.max() == 3
    # Disjoint, and covering every sample of the used classes (here all of them).
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))
    # A class's samples are split evenly among its holders.
    for k in range(NUM_CLASSES):
        shares = [np.count_nonzero(labels[p] == k) for p, h in zip(parts, held, strict=True) if k in h]
        assert max(shares) - min(shares) <= 1


def test_pathological_unused_classes_left_out():
    labels = balanced_labels()
    parts = split(labels, num_clients=3, kind="pathological", classes_per_client=2)
    used = np.unique(np.concatenate([labels[p] for p in parts]))
    assert len(used) == 6
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.flatnonzero(np.isin(labels, used)))


def test_pathological_handles_non_contiguous_labels():
    labels = np.repeat([2, 5, 9], 40)
    parts = split(labels, num_clients=6, kind="pathological", classes_per_client=2)
    assert all(len(np.unique(labels[p])) == 2 for p in parts)
    with pytest.raises(ConfigError) as info:
        split(labels, num_clients=6, kind="pathological", classes_per_client=4)
    assert info.value.key == "partition.classes_per_client"


def test_shards_give_each_client_few_classes():
    labels = balanced_labels()  # 10 classes x 200; 20 shards of 100 are each a single class
    parts = split(labels, num_clients=10, kind="shards", shards_per_client=2)
    assert all(len(p) == 200 for p in parts)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_dirichlet_smaller_alpha_more_skewed():
    labels = balanced_labels()
    skewed = split(labels, num_clients=10, kind="dirichlet", alpha=0.1, min_size=1)
    mixed = split(labels, num_clients=10, kind="dirichlet", alpha=10.0, min_size=1)
    h_skewed = np.mean([label_entropy(labels[p]) for p in skewed])
    h_mixed = np.mean([label_entropy(labels[p]) for p in mixed])
    assert h_skewed < h_mixed - 0.5
    assert h_mixed > 0.9 * np.log(NUM_CLASSES)


def test_dirichlet_min_size_respected():
    labels = balanced_labels()
    kw = {"num_clients": 20, "kind": "dirichlet", "alpha": 0.3}
    unconstrained = [min(len(p) for p in split(labels, seed=seed, min_size=1, **kw)) for seed in range(8)]
    assert min(unconstrained) < 30  # without the constraint some client would be too small
    for seed in range(8):
        assert min(len(p) for p in split(labels, seed=seed, min_size=30, **kw)) >= 30


class CountingRng:
    """A generator that counts its Dirichlet draws."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.dirichlet_calls = 0

    def permutation(self, *args, **kwargs):
        return self.rng.permutation(*args, **kwargs)

    def dirichlet(self, *args, **kwargs):
        self.dirichlet_calls += 1
        return self.rng.dirichlet(*args, **kwargs)


def test_dirichlet_impossible_raises_after_max_retries():
    rng = CountingRng(0)
    cfg = PartitionConfig(kind="dirichlet", num_clients=10, min_size=10, max_retries=7)
    with pytest.raises(ConfigError) as info:
        partition_train(balanced_labels(per_class=5), cfg, rng)  # 50 samples cannot give 10 x 10
    assert info.value.key == "partition.alpha"
    assert "7 draws" in str(info.value)
    assert rng.dirichlet_calls == 7


def test_dirichlet_stops_at_first_acceptable_draw():
    rng = CountingRng(0)
    cfg = PartitionConfig(kind="dirichlet", num_clients=5, alpha=100.0, min_size=1, max_retries=50)
    partition_train(balanced_labels(), cfg, rng)
    assert rng.dirichlet_calls == 1


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological", "shards", "natural"])
def test_more_clients_than_samples(kind):
    labels = np.arange(5) % 2
    with pytest.raises(ConfigError, match=r"more clients \(6\) than training samples \(5\)") as info:
        split(labels, groups=np.arange(5), kind=kind, num_clients=6)
    assert info.value.key == "partition.num_clients"


def test_pathological_more_classes_than_exist():
    with pytest.raises(ConfigError) as info:
        split(balanced_labels(), kind="pathological", classes_per_client=11)
    assert info.value.key == "partition.classes_per_client"
    assert "10 classes" in str(info.value)


def test_pathological_class_too_small_for_its_holders():
    labels = np.concatenate([np.zeros(50, dtype=int), np.ones(2, dtype=int)])
    with pytest.raises(ConfigError) as info:
        split(labels, kind="pathological", num_clients=6, classes_per_client=1)  # class 1: 3 holders
    assert info.value.key == "partition.num_clients"
    # With fewer holders than samples the same data splits fine.
    assert len(split(labels, kind="pathological", num_clients=2, classes_per_client=1)) == 2


def test_too_many_shards():
    with pytest.raises(ConfigError) as info:
        split(np.arange(30) % 3, kind="shards", num_clients=10, shards_per_client=4)
    assert info.value.key == "partition.shards_per_client"


def test_natural_needs_groups():
    with pytest.raises(ConfigError) as info:
        split(balanced_labels(), kind="natural")
    assert info.value.key == "partition.kind"
    assert "femnist" in str(info.value)


def test_natural_more_clients_than_groups():
    labels = balanced_labels(per_class=60)
    with pytest.raises(ConfigError) as info:
        split(labels, groups=GROUPS, kind="natural", num_clients=13)
    assert info.value.key == "partition.num_clients"


def test_natural_one_client_per_group():
    labels = balanced_labels(per_class=60)
    groups = np.random.default_rng(1).permutation(GROUPS) * 7 + 100  # arbitrary ids, scattered
    parts = split(labels, groups=groups, kind="natural", num_clients=12)
    owners = [np.unique(groups[p]) for p in parts]
    assert all(len(o) == 1 for o in owners)
    np.testing.assert_array_equal(np.concatenate(owners), np.unique(groups))
    for part, owner in zip(parts, owners, strict=True):
        np.testing.assert_array_equal(part, np.flatnonzero(groups == owner[0]))


def test_natural_fewer_clients_pick_whole_distinct_groups():
    labels = balanced_labels(per_class=60)
    picks = set()
    for seed in range(4):
        parts = split(labels, seed=seed, groups=GROUPS, kind="natural", num_clients=4)
        owners = [int(np.unique(GROUPS[p]).item()) for p in parts]
        assert len(set(owners)) == 4
        assert all(len(p) == 50 for p in parts)
        picks.add(tuple(owners))
    assert len(picks) > 1


def test_test_sets_follow_train_distribution_exactly():
    test_labels = np.repeat(np.arange(4), 100)
    train = [np.repeat([0, 1], [30, 10]), np.repeat([1, 2, 3], [5, 5, 10]), np.array([3])]
    tests = partition_test(test_labels, train, 4, 8, np.random.default_rng(0))
    counts = [np.bincount(test_labels[t], minlength=4).tolist() for t in tests]
    assert counts == [[6, 2, 0, 0], [0, 2, 2, 4], [0, 0, 0, 8]]
    for t in tests:
        assert t.dtype == np.int64
        assert np.all(np.diff(t) > 0)  # sorted, no sample twice within a client


def test_test_sets_largest_remainder_and_default_size():
    test_labels = np.repeat(np.arange(3), 50)
    train = [np.array([0, 1, 2])] * 2 + [np.array([0, 0, 1, 1, 2])]
    tests = partition_test(test_labels, train, 3, None, np.random.default_rng(0))
    assert [len(t) for t in tests] == [50, 50, 50]  # 150 test samples // 3 clients
    # 50 over weights (2, 2, 1): exact 20, 20, 10.
    assert np.bincount(test_labels[tests[2]], minlength=3).tolist() == [20, 20, 10]
    # 4 over equal weights: floors (1, 1, 1), the remaining one to the lowest class.
    tests = partition_test(test_labels, [np.array([0, 1, 2])], 3, 4, np.random.default_rng(0))
    assert np.bincount(test_labels[tests[0]], minlength=3).tolist() == [2, 1, 1]


def test_test_sets_top_up_with_replacement_only_when_short():
    test_labels = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    tests = partition_test(test_labels, [np.array([0, 1])], 2, 8, np.random.default_rng(0))
    drawn = tests[0]
    assert len(drawn) == 8
    zeros = drawn[test_labels[drawn] == 0]
    assert len(zeros) == 4 and set(zeros.tolist()) == {0, 1}  # both class-0 samples, then repeats
    ones = drawn[test_labels[drawn] == 1]
    assert len(np.unique(ones)) == 4


def test_test_sets_skip_classes_missing_from_test_split():
    test_labels = np.repeat([0, 2], 20)
    train = [np.array([0, 1, 1, 1]), np.array([1, 1])]
    tests = partition_test(test_labels, train, 3, 6, np.random.default_rng(0))
    assert np.bincount(test_labels[tests[0]], minlength=3).tolist() == [6, 0, 0]
    assert np.bincount(test_labels[tests[1]], minlength=3).tolist() == [3, 0, 3]  # test split's own mix


def test_test_sets_deterministic_and_independent_across_clients():
    test_labels = np.repeat(np.arange(2), 100)
    train = [np.array([0, 1])] * 2
    first = partition_test(test_labels, train, 2, 20, np.random.default_rng(5))
    again = partition_test(test_labels, train, 2, 20, np.random.default_rng(5))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], first[1])


def test_grouped_groups_share_labels_and_no_class_crosses_groups():
    labels = balanced_labels()
    parts = split(labels, num_clients=10, kind="grouped", num_groups=4)
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) and len(np.unique(joined)) == len(labels)
    label_sets = [frozenset(np.unique(labels[p]).tolist()) for p in parts]
    groups = set(label_sets)
    assert len(groups) == 4
    assert sorted(len(g) for g in groups) == [2, 2, 3, 3]
    assert sorted(label_sets.count(g) for g in groups) == [2, 2, 3, 3]
    assert len(frozenset().union(*groups)) == NUM_CLASSES  # disjoint blocks cover every class
    first_seen = [label_sets.index(s) for s in label_sets]
    assert first_seen != sorted(first_seen)  # membership is shuffled, not contiguous blocks of client ids


def test_grouped_needs_enough_classes_and_clients():
    with pytest.raises(ConfigError, match="partition.num_groups"):
        split(balanced_labels(), num_clients=20, kind="grouped", num_groups=11)
    with pytest.raises(ConfigError, match="partition.num_groups"):
        split(balanced_labels(), num_clients=3, kind="grouped", num_groups=4)
