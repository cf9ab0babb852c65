"""Partitioners: which training samples each federated client holds, and each client's test set.

:func:`partition_train` divides the training set among ``cfg.num_clients`` clients (disjoint, sorted
int64 index arrays) by one of the kinds in :data:`PARTITIONERS`. :func:`partition_test` then builds, for
every client, a test set drawn from the global test split with the client's own training label
proportions, so personalised accuracy is measured on the distribution the client was trained for.
Every random draw comes from the generator passed in, so a seeded generator gives a reproducible split.
"""

from __future__ import annotations

import numpy as np

from fedge.config import PartitionConfig
from fedge.errors import ConfigError

PARTITIONERS: dict[str, str] = {
    "iid": "uniform random split, client sizes differ by at most one",
    "dirichlet": "per-class client proportions ~ Dir(alpha); smaller alpha = more label skew",
    "pathological": "each client holds exactly classes_per_client classes, classes used evenly",
    "shards": "label-sorted shards, shards_per_client random shards per client (McMahan et al.)",
    "natural": "one client per natural group, e.g. FEMNIST writer (random subset if fewer clients)",
    "grouped": "num_groups client groups owning disjoint class sets (ground truth of who is alike)",
}


def partition_labels(labels: np.ndarray) -> np.ndarray:
    """The labels partitioners read: the class of each sample, or one class (0) for every sample of token
    sequences, whose targets are one token per position (natural groups or iid split them)."""
    labels = np.asarray(labels)
    return labels if labels.ndim == 1 else np.zeros(len(labels), dtype=np.int64)


def partition_train(
    labels: np.ndarray,
    cfg: PartitionConfig,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Split the indices of ``labels`` among ``cfg.num_clients`` clients by ``cfg.kind``.

    Returns one sorted int64 index array per client; the arrays are disjoint and none is empty.
    ``groups`` (a natural group id per sample) is needed, and only used, by ``natural``. Raises
    :class:`ConfigError` naming the config key to change when the split is impossible.
    """
    labels = np.asarray(labels)
    n = cfg.num_clients
    if n > len(labels):
        raise ConfigError(
            "partition.num_clients", f"more clients ({n}) than training samples ({len(labels)})"
        )
    if cfg.kind == "iid":
        parts = np.array_split(rng.permutation(len(labels)), n)
    elif cfg.kind == "dirichlet":
        parts = _dirichlet(labels, cfg, rng)
    elif cfg.kind == "pathological":
        parts = _pathological(labels, cfg, rng)
    elif cfg.kind == "shards":
        parts = _shards(labels, cfg, rng)
    elif cfg.kind == "grouped":
        parts = _grouped(labels, cfg, rng)
    else:
        parts = _natural(labels, cfg, rng, groups)
    return [np.sort(part).astype(np.int64) for part in parts]


def _shuffled_by_class(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """All indices shuffled, then stably sorted by label, and the size of each present class.

    Within each class the order is random, so consecutive slices of the result are random draws of
    that class. Classes are the distinct label values present, in increasing order.
    """
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    _, sizes = np.unique(labels, return_counts=True)
    return order, sizes


def _dirichlet(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Label-Dirichlet split: class k is divided among clients by proportions q_k ~ Dir(alpha * 1_n).

    Only the per-client counts are drawn in the retry loop (cheap); the whole draw is repeated until
    every client holds at least ``cfg.min_size`` samples, up to ``cfg.max_retries`` draws.
    """
    n = cfg.num_clients
    order, sizes = _shuffled_by_class(labels, rng)
    for _ in range(cfg.max_retries):
        proportions = rng.dirichlet(np.full(n, cfg.alpha), size=len(sizes))  # [classes, clients]
        cuts = (np.cumsum(proportions, axis=1) * sizes[:, None]).astype(np.int64)
        cuts[:, -1] = sizes  # guard against cumsum rounding just below 1
        counts = np.diff(cuts, axis=1, prepend=0)
        if counts.sum(axis=0).min() >= cfg.min_size:
            break
    else:
        raise ConfigError(
            "partition.alpha",
            f"could not give every one of the {n} clients at least {cfg.min_size} samples in "
            f"{cfg.max_retries} draws; raise partition.alpha or lower partition.min_size",
        )
    # ``order`` holds the class blocks back to back; client j takes counts[k, j] consecutive samples of
    # block k, clients in turn, so the owners of ``order`` are the client ids repeated class by class.
    owner = np.repeat(np.tile(np.arange(n), len(sizes)), counts.ravel())
    return _group_by_owner(order, owner, n)


def _pathological(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Each client holds exactly c classes: client i gets classes perm[(i*c + j) mod K], j < c.

    ``perm`` is a seeded permutation of the K present classes, so the assignment is random but
    balanced: every class is held by floor(n*c/K) or ceil(n*c/K) clients. Each class's samples are
    split as evenly as possible among the clients holding it.
    """
    n, c = cfg.num_clients, cfg.classes_per_client
    order, sizes = _shuffled_by_class(labels, rng)
    num_classes = len(sizes)
    if c > num_classes:
        raise ConfigError(
            "partition.classes_per_client",
            f"{c} classes per client but the training data has only {num_classes} classes",
        )
    held = rng.permutation(num_classes)[(np.arange(n)[:, None] * c + np.arange(c)) % num_classes]
    holders = np.bincount(held.ravel(), minlength=num_classes)
    short = np.flatnonzero(sizes < holders)
    if short.size:
        k = short[0]
        raise ConfigError(
            "partition.num_clients",
            f"class {np.unique(labels)[k]} has {sizes[k]} samples but {holders[k]} clients hold it; "
            "lower partition.num_clients or partition.classes_per_client",
        )
    blocks = np.split(order, np.cumsum(sizes)[:-1])
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k in np.flatnonzero(holders):
        clients = np.flatnonzero((held == k).any(axis=1))
        for client, chunk in zip(clients, np.array_split(blocks[k], len(clients)), strict=True):
            parts[client].append(chunk)
    return [np.concatenate(chunks) for chunks in parts]


def _shards(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al.: sort by label, cut into n * s equal shards, give each client s random shards.

    Shard sizes differ by at most one so that every sample is used.
    """
    n, s = cfg.num_clients, cfg.shards_per_client
    total = n * s
    if total > len(labels):
        raise ConfigError(
            "partition.shards_per_client",
            f"{n} clients x {s} shards = {total} shards but only {len(labels)} training samples; "
            "lower partition.shards_per_client",
        )
    order, _ = _shuffled_by_class(labels, rng)
    shard_owner = np.empty(total, dtype=np.int64)
    shard_owner[rng.permutation(total)] = np.repeat(np.arange(n), s)
    shard_sizes = np.diff(np.linspace(0, len(labels), total + 1).astype(np.int64))
    return _group_by_owner(order, np.repeat(shard_owner, shard_sizes), n)


def _natural(
    labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator, groups: np.ndarray | None
) -> list[np.ndarray]:
    """One client per natural group; a seeded random choice of groups when there are more groups.

    Clients follow the increasing order of the chosen group ids; samples of unchosen groups are unused.
    """
    if groups is None:
        raise ConfigError("partition.kind", "natural needs a dataset with natural groups (femnist)")
    groups = np.asarray(groups)
    if len(groups) != len(labels):
        raise ValueError(f"groups has {len(groups)} entries for {len(labels)} samples")
    ids, inverse = np.unique(groups, return_inverse=True)
    n = cfg.num_clients
    if n > len(ids):
        raise ConfigError(
            "partition.num_clients", f"more clients ({n}) than natural groups ({len(ids)}) in the data"
        )
    by_group = _group_by_owner(np.arange(len(labels)), inverse, len(ids))
    chosen = np.sort(rng.choice(len(ids), size=n, replace=False)) if n < len(ids) else np.arange(n)
    return [by_group[g] for g in chosen]


def _grouped(labels: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Clients fall into ``num_groups`` groups; group g owns a disjoint block of the classes.

    The present classes are shuffled and cut into ``num_groups`` nearly equal blocks; every class is split
    evenly among the clients of the group that owns it. Clients of one group thus share one label
    distribution and no class with any other group: the ground truth of who is a "friendly" neighbour, to
    check AFIND+'s neighbour identification (Sec. 3.2). Groups differ in size by at most one and
    membership is a seeded shuffle, so it does not follow client ids; clients with the same set of labels
    are in the same group.
    """
    n, g = cfg.num_clients, cfg.num_groups
    order, sizes = _shuffled_by_class(labels, rng)
    if g > len(sizes):
        raise ConfigError(
            "partition.num_groups", f"{g} groups but the training data has only {len(sizes)} classes"
        )
    if g > n:
        raise ConfigError("partition.num_groups", f"{g} groups but only {n} clients")
    owner_of_class = np.empty(len(sizes), dtype=np.int64)
    for group, block in enumerate(np.array_split(rng.permutation(len(sizes)), g)):
        owner_of_class[block] = group
    group_of = rng.permutation(n) % g
    blocks = np.split(order, np.cumsum(sizes)[:-1])
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k, samples in enumerate(blocks):
        members = np.flatnonzero(group_of == owner_of_class[k])
        if len(samples) < len(members):
            raise ConfigError(
                "partition.num_clients",
                f"a class has {len(samples)} samples for {len(members)} clients of its group; "
                "lower partition.num_clients",
            )
        for client, chunk in zip(members, np.array_split(samples, len(members)), strict=True):
            parts[client].append(chunk)
    return [np.concatenate(chunks) for chunks in parts]


def _group_by_owner(items: np.ndarray, owner: np.ndarray, n: int) -> list[np.ndarray]:
    """Split ``items`` into ``n`` arrays, item i going to array ``owner[i]``."""
    order = np.argsort(owner, kind="stable")
    return np.split(items[order], np.cumsum(np.bincount(owner, minlength=n))[:-1])


def partition_test(
    test_labels: np.ndarray,
    client_train_labels: list[np.ndarray],
    num_classes: int,
    test_size: int | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Per-client test sets (sorted int64 indices into ``test_labels``) with the clients' train label mix.

    Each client gets ``test_size`` samples (default ``len(test_labels) // n_clients``, at least 1),
    allocated over classes in proportion to its training label counts with largest-remainder rounding,
    so the size is exact. Classes absent from the test split get no share; a client none of whose
    classes appear in the test split follows the test split's own class mix. Within a client, samples of
    a class are drawn without replacement, topped up with replacement only when the class has too few
    test samples. Clients draw independently, so their test sets may overlap.
    """
    test_labels = np.asarray(test_labels)
    size = test_size if test_size is not None else max(1, len(test_labels) // len(client_train_labels))
    test_counts = np.bincount(test_labels, minlength=num_classes)
    order = np.argsort(test_labels, kind="stable")
    pools = np.split(order, np.cumsum(test_counts)[:-1])
    result = []
    for train_labels in client_train_labels:
        weights = np.bincount(np.asarray(train_labels), minlength=num_classes) * (test_counts > 0)
        if weights.sum() == 0:
            weights = test_counts
        quotas = _largest_remainder(weights, size)
        picks = [_draw(pools[k], int(quotas[k]), rng) for k in np.flatnonzero(quotas)]
        result.append(np.sort(np.concatenate(picks)).astype(np.int64))
    return result


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts proportional to ``weights`` summing exactly to ``total`` (ties to lower index)."""
    exact = weights * total / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    remainder = total - counts.sum()
    counts[np.argsort(counts - exact, kind="stable")[:remainder]] += 1
    return counts


def _draw(pool: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` items of ``pool``: without replacement, or all of it plus a top-up with replacement."""
    if count <= len(pool):
        return rng.choice(pool, size=count, replace=False)
    return np.concatenate([pool, rng.choice(pool, size=count - len(pool), replace=True)])
