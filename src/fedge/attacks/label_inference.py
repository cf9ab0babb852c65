"""Label inference from split learning's cut gradients (Li et al., "Label Leakage and Protection in
Two-party Split Learning", ICLR 2022).

Threat model. In split learning the server holds the top of the model and the loss, so it needs the
labels; the gradient it returns for each sample's cut activation depends on that label. Whoever sees
these returned gradients (a client, or an eavesdropper on the wireless downlink) tries to tell each
sample's label. The attacker sees the per-sample cut gradients only, not the server model.

Two attacks:

- Norm attack: the gradient's L2 norm as the score of the positive class. It is built for binary
  tasks with imbalanced labels: a model that mostly predicts the common negative class is far off on
  the rare positives, so their loss gradients are larger. On balanced or multi-class tasks the norm
  says little; :func:`norm_attack` still reports each class's one-vs-rest AUC there.
- Direction attack: gradients of samples with the same label point in similar directions. The
  attacker knows a few labelled samples per class (its own) and gives every other sample the label of
  its most cosine-similar known gradient.

Success metrics: ROC AUC of the norm as a score of the label; for the direction attack the accuracy
on the unknown samples (against chance, one over the number of classes) and the ROC AUC of a pair's
cosine similarity as the score that the pair shares a label.
"""

from __future__ import annotations

import math

import torch

from fedge.attacks.metrics import roc_auc

PAIR_CHUNK = 8192  # pairs whose cosine similarity is computed at a time (bounds memory for wide cuts)


def norm_scores(grads: torch.Tensor) -> torch.Tensor:
    """Each sample's gradient L2 norm (all dimensions after the first flattened), ``[N]``."""
    if grads.dim() < 2:
        raise ValueError(f"gradients need a sample dimension and a feature dimension, got {grads.dim()}-d")
    return grads.detach().flatten(1).float().norm(dim=1)


def norm_attack(grads: torch.Tensor, labels: torch.Tensor, classes: int) -> dict[str, float | list[float]]:
    """The gradient norm as a score of the label. Binary tasks: ``auc`` for the positive class 1.
    Multi-class: ``auc`` the mean one-vs-rest AUC over the classes present and ``auc_per_class``
    indexed by class (``nan`` where a class is absent). Li et al. designed it for binary tasks with a
    rare positive class; elsewhere expect it near 0.5."""
    scores = norm_scores(grads)
    labels = _check_labels(labels, classes, len(scores))
    if classes == 2:
        return {"auc": roc_auc(scores, labels == 1)}
    per_class = [
        roc_auc(scores, labels == c) if bool((labels == c).any()) else math.nan for c in range(classes)
    ]
    present = [auc for auc in per_class if not math.isnan(auc)]
    return {"auc": sum(present) / len(present), "auc_per_class": per_class}


def direction_attack(
    grads: torch.Tensor,
    labels: torch.Tensor,
    classes: int,
    known_per_class: int = 1,
    generator: torch.Generator | None = None,
    max_pairs: int = 200_000,
) -> dict[str, float]:
    """Cosine-similarity label inference: ``known_per_class`` samples of each present class (drawn with
    ``generator``) have known labels, every other sample takes the label of its most similar known
    gradient (``accuracy``, with ``chance``); ``auc`` scores pairs' shared label by their cosine
    similarity over all pairs, or ``max_pairs`` pairs drawn with ``generator`` when there are more."""
    if known_per_class < 1 or max_pairs < 1:
        raise ValueError("known_per_class and max_pairs must be at least 1")
    units = _unit_rows(grads)
    labels = _check_labels(labels, classes, len(units))
    known = _known_samples(labels, classes, known_per_class, generator)
    unknown = torch.ones(len(labels), dtype=torch.bool)
    unknown[known] = False
    if not bool(unknown.any()):
        raise ValueError("every sample is known to the attacker: no label left to infer")
    nearest = (units[unknown] @ units[known].T).argmax(dim=1)
    guessed = labels[known][nearest]
    first, second = _pairs(len(labels), max_pairs, generator)
    similarity = _pair_cosines(units, first, second)
    return {
        "accuracy": float((guessed == labels[unknown]).float().mean()),
        "chance": 1.0 / classes,
        "auc": roc_auc(similarity, labels[first] == labels[second]),
        "known": float(len(known)),
        "unknown": float(unknown.sum()),
        "pairs": float(len(first)),
    }


def _check_labels(labels: torch.Tensor, classes: int, samples: int) -> torch.Tensor:
    """``labels`` as a ``[N]`` long tensor, checked against the number of samples and classes; at least
    two classes must be present for any AUC to exist."""
    labels = labels.detach().reshape(-1).long()
    if len(labels) != samples:
        raise ValueError(f"{len(labels)} labels for {samples} gradients")
    if classes < 2:
        raise ValueError(f"a label attack needs at least 2 classes, got {classes}")
    if bool((labels < 0).any()) or bool((labels >= classes).any()):
        raise ValueError(f"labels must lie in [0, {classes})")
    if len(labels.unique()) < 2:
        raise ValueError("fewer than 2 classes present in the labels")
    return labels


def _unit_rows(grads: torch.Tensor) -> torch.Tensor:
    """Each flattened gradient scaled to unit norm; an all-zero row stays zero (cosine 0 to everything)."""
    norms = norm_scores(grads)
    flat = grads.detach().flatten(1).float()
    return flat / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(1)


def _known_samples(
    labels: torch.Tensor, classes: int, per_class: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Indices of up to ``per_class`` samples of each present class, drawn without replacement."""
    chosen = []
    for c in range(classes):
        members = (labels == c).nonzero().flatten()
        order = torch.randperm(len(members), generator=generator)
        chosen.append(members[order[:per_class]])
    return torch.cat(chosen)


def _pairs(
    samples: int, max_pairs: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """All unordered pairs of distinct samples, or ``max_pairs`` uniformly drawn ones when there are more."""
    if samples * (samples - 1) // 2 <= max_pairs:
        first, second = torch.triu_indices(samples, samples, offset=1)
        return first, second
    first = torch.randint(samples, (max_pairs,), generator=generator)
    second = torch.randint(samples - 1, (max_pairs,), generator=generator)
    return first, second + (second >= first).long()


def _pair_cosines(units: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The cosine similarity of each pair of unit rows, a chunk of pairs at a time."""
    return torch.cat(
        [
            (units[first[start : start + PAIR_CHUNK]] * units[second[start : start + PAIR_CHUNK]]).sum(1)
            for start in range(0, len(first), PAIR_CHUNK)
        ]
    )
