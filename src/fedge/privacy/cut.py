"""Privacy at split learning's cut: the Gaussian mechanism on each sample's smashed data (and cut
gradient), k-ary randomized response on the labels a client sends, and their planners.

Smashed data. Before a client sends the activations at the cut, each sample's activation (the whole
``[T, d]`` hidden state of a sequence for a language model) is clipped to L2 norm ``clip`` and given
Gaussian noise of std ``noise_multiplier * clip``: per send, the Gaussian mechanism on that sample with
sensitivity ``clip`` under add/remove-one (the released batch holds the sample's row or not). The server
trains on the noisy activations; every send of a sample is a release of it, so a sample's guarantee
composes over the times its activations cross the cut (every batch it is in for SplitFed and FSL_AN,
only the uploaded batches for CSE-FSL). The cut gradient the server returns is treated alike: it depends
on the sample's label and the server model, so with ``gradient_clip`` each sample's row is clipped and
noised before it goes down, one release of that sample per return.

Labels. k-ary randomized response (Warner's mechanism generalised to k values; the label-DP form of
Ghazi et al., "Deep learning with label differential privacy", 2021): each label is kept with
probability ``e^eps / (e^eps + k - 1)`` and otherwise replaced by a uniformly drawn other label, which is
the same as replacing it with probability ``p = k / (e^eps + k - 1)`` by a uniform draw over all k
classes. The noisy label is drawn once per sample for the whole run: the server then sees the same
noisy value every epoch, and sending an already randomized value again is post-processing, so a sample's
label is released once (epsilon ``eps`` exactly), not once per epoch. Without ``privacy.labels`` labels
cross the cut in clear and the run gives no label guarantee at all (nothing is recorded for them: a
release without noise would only say epsilon is infinite).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedge.config import RunConfig
from fedge.privacy.release import GAUSSIAN, RANDOMIZED_RESPONSE, Release
from fedge.privacy.run import RunPrivacy


def clip_rows(z: torch.Tensor, clip: float, lead: int = 1) -> torch.Tensor:
    """``z`` with each sample (every dimension after the ``lead`` leading ones) scaled to L2 norm at most
    ``clip``: ``z * min(1, clip / ||z||)``. Differentiable (a backward pass goes through the clip), and
    an exact identity on samples already within the bound."""
    norms = torch.linalg.vector_norm(z.flatten(lead), dim=-1)
    factor = (clip / norms.clamp_min(torch.finfo(z.dtype).tiny)).clamp(max=1.0)
    return z * factor.reshape(*factor.shape, *([1] * (z.dim() - lead)))


def add_row_noise(
    z: torch.Tensor,
    counts: torch.Tensor,
    std: float,
    privacy: RunPrivacy,
    purpose: str,
    keys: Sequence[tuple[int, ...]],
) -> torch.Tensor:
    """``z`` (``[rows, batch, ...]``) with Gaussian noise of ``std`` on every row's first ``counts[r]``
    entries (the samples it sends), row ``r``'s noise from the stream ``(purpose, *keys[r])``."""
    if std == 0.0:
        return z
    noise = torch.zeros_like(z)
    for r, (key, count) in enumerate(zip(keys, counts.tolist(), strict=True)):
        if count:
            noise[r, :count] = privacy.gaussian(z[r, :count], std, purpose, *key)
    return z + noise


def keep_probability(epsilon: float, classes: int) -> float:
    """The probability k-ary randomized response at ``epsilon`` keeps a label: ``e^eps / (e^eps + k - 1)``."""
    return 1.0 / (1.0 + (classes - 1) * math.exp(-epsilon))


def replace_probability(epsilon: float, classes: int) -> float:
    """The probability ``p = k / (e^eps + k - 1)`` that a label is replaced by a uniform draw over all k
    classes (the ledger's randomized-response parameter)."""
    return classes / (math.exp(epsilon) + classes - 1)


def randomized_response(
    labels: torch.Tensor, epsilon: float, classes: int, generator: torch.Generator
) -> torch.Tensor:
    """``labels`` after k-ary randomized response at ``epsilon``: each kept with
    :func:`keep_probability`, else replaced by a uniformly drawn other class (all draws from
    ``generator``, on the CPU, so every device sees the same labels)."""
    flat = labels.detach().cpu().long()
    keep = torch.rand(flat.shape, generator=generator) < keep_probability(epsilon, classes)
    shift = (
        torch.randint(1, classes, flat.shape, generator=generator) if classes > 1 else torch.zeros_like(flat)
    )
    other = (flat + shift) % classes
    return torch.where(keep, flat, other).to(device=labels.device, dtype=labels.dtype)


def label_release(t: int, epsilon: float, classes: int, client: int) -> Release:
    """The release of a client's labels by randomized response, recorded once (the round it first
    sends labels)."""
    p = replace_probability(epsilon, classes)
    return Release(t, "label", "label", RANDOMIZED_RESPONSE, p, buckets=classes, clients=(client,))


def most_sends(clients: np.ndarray, indices: np.ndarray) -> dict[int, int]:
    """Per client, the most times any one of its samples was sent: ``indices`` (``[rows, ...]``, -1 for
    nothing sent) are the samples each row (of client ``clients[r]``) sent, with repetition."""
    out: dict[int, int] = {}
    for client in np.unique(clients):
        sent = indices[clients == client].ravel()
        sent = sent[sent >= 0]
        if sent.size:
            out[int(client)] = int(np.bincount(sent).max())
    return out


def step_rounds(config: RunConfig) -> bool:
    """Whether a round of the run is one step of every client, its epochs spanning rounds (lightweight
    FedSL and FedSL mark their configs ``step_rounds``)."""
    return bool(getattr(config.algorithm, "step_rounds", False))


def epoch_batches(config: RunConfig, size: int) -> int:
    """A split client's batches in one pass over its ``size`` samples (0: it has no batch)."""
    algorithm = config.algorithm
    batch = int(getattr(algorithm, "batch_size", 1))
    return size // batch if getattr(algorithm, "drop_last", False) else -(-size // batch)


def begins_pass(config: RunConfig, size: int, t: int) -> bool:
    """Whether round ``t`` opens a pass over a client's ``size`` samples, the round whose releases stand
    for the pass: every round where a round is whole passes; where it is one step (:func:`step_rounds`),
    the first round of each epoch. An epoch's batches are disjoint, so a sample is released once in the
    epoch's rounds (the parallel composition the other planners apply within a round), and recording
    that release at the epoch's first round never reports less than was spent."""
    if not step_rounds(config):
        return True
    per_epoch = epoch_batches(config, size)
    return per_epoch > 0 and (t - 1) % per_epoch == 0


def round_batches(config: RunConfig, size: int) -> tuple[int, int]:
    """A split client's round over ``size`` samples: (its passes over the data, its batches), the
    passes counting a started epoch whole; ``(0, 0)`` for a client without a batch."""
    algorithm = config.algorithm
    per_epoch = epoch_batches(config, size)
    if per_epoch == 0:
        return 0, 0
    local_steps = 1 if step_rounds(config) else getattr(algorithm, "local_steps", None)
    batches = (
        int(local_steps)
        if local_steps is not None
        else per_epoch * int(getattr(algorithm, "local_epochs", 1))
    )
    return -(-batches // per_epoch), batches


def draws_per_round(config: RunConfig) -> int:
    """How many times one client can be drawn in a round: the cohort size under independent draws with
    replacement, else once."""
    algorithm = config.algorithm
    independent = getattr(algorithm, "duplicates", "merge") == "independent"
    if getattr(algorithm, "participation", "full") == "with_replacement" and independent:
        return int(getattr(algorithm, "clients_per_round", None) or 1)
    return 1


def planned_sends(config: RunConfig, size: int) -> int:
    """The most times one sample of a client of ``size`` samples can cross the cut in a round: once
    per pass over its data (epoch) among the round's batches, and for CSE-FSL and FSL-SAGE no more than
    their upload steps (one every h batches; one server batch under the every-l-rounds trigger); times
    the draws of one client a round can hold (independent draws with replacement)."""
    algorithm = config.algorithm
    sends, batches = round_batches(config, size)
    if batches == 0:
        return 0
    h = getattr(algorithm, "h", None)
    if getattr(algorithm, "server_trigger", "every_h_batches") == "every_l_rounds":
        sends = 1
    elif h is not None:
        sends = min(sends, -(-batches // int(h)))
    sends *= draws_per_round(config)
    return sends


def plan_cut(config: RunConfig, data_sizes: list[int], multiplier: float) -> list[Release]:
    """The smashed-data releases of a whole run, at ``privacy.cut.noise_multiplier`` or, where that is
    unset, at ``multiplier`` (the calibrated one): every client trains every round, each sample sent the
    most times a round allows (:func:`planned_sends`; one-step rounds at each epoch's first,
    :func:`begins_pass`). With ``gradient_clip``, an algorithm whose config says
    ``returns_cut_gradient`` (every sent sample's gradient comes back) plans as many cut-gradient
    releases at ``gradient_noise_multiplier``."""
    cut = config.privacy.cut
    if cut is None:
        return []
    if cut.noise_multiplier is not None:
        multiplier = cut.noise_multiplier
    returned = cut.gradient_clip if getattr(config.algorithm, "returns_cut_gradient", False) else None
    releases = []
    for t in range(1, config.rounds + 1):
        for c, size in enumerate(data_sizes):
            sends = planned_sends(config, size)
            if not sends or not begins_pass(config, size, t):
                continue
            releases.append(
                Release(t, "smashed", "sample", GAUSSIAN, multiplier, cut.clip, count=sends, clients=(c,))
            )
            if returned is not None:
                z = cut.gradient_noise_multiplier
                releases.append(
                    Release(t, "cut_gradient", "sample", GAUSSIAN, z, returned, count=sends, clients=(c,))
                )
    return releases


def plan_labels(config: RunConfig, data_sizes: list[int], multiplier: float) -> list[Release]:
    """The label releases of a whole run (``privacy.labels``): one per client, in round 1. Their epsilon
    is configured, not calibrated, so ``multiplier`` changes nothing; they are planned so that a
    budget check sees them. The class count is the synthetic data's (``data.num_classes``) or, for a
    named dataset the config does not size, 2: a randomized response at ``eps`` is ``eps``-DP whatever
    the count."""
    labels = config.privacy.labels
    if labels is None:
        return []
    classes = config.data.num_classes if config.data.name == "synthetic" else 2
    return [label_release(1, labels.epsilon, classes, c) for c, size in enumerate(data_sizes) if size]
