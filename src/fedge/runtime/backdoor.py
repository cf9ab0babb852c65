"""A targeted backdoor with a pixel trigger: the malicious clients' poisoned data and its success rate.

BadNets (Gu et al., "BadNets: identifying vulnerabilities in the machine learning model supply chain",
2017) stamps a small square of bright pixels on a training image and relabels it to the attacker's
target class; in federated learning the malicious clients train on such data (Bagdasaryan et al., "How to
backdoor federated learning", 2020, who boost the upload by model replacement: the adversary's ``scale``).
Here the trigger is a ``trigger_size`` square in the bottom-right corner of every channel, at the
training inputs' largest value; each malicious client stamps and relabels ``poison_fraction`` of its
samples, drawn once from ``(seed, "adversary-backdoor", client)``.

The poisoned samples are copies appended to the training tensors and named only by the malicious
clients' index arrays (a shard position keeps its place, so its batches are the clean run's), so no
honest client reads a stamped copy, even of a sample it shares. The attack success rate is the share of
the test samples whose label is not the target that the model classifies as the target once stamped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedge.data.federated import FederatedData, ResampledClients
from fedge.engine.bind import call_at
from fedge.errors import ConfigError
from fedge.rng import numpy_rng
from fedge.tensors import Tensors

DEFAULTS = {"target": 0, "trigger_size": 3, "poison_fraction": 0.5}
"""The backdoor's options' defaults (its ``scale`` is the adversary's, 1: no boost)."""


@dataclass(frozen=True)
class Trigger:
    """A ``size`` x ``size`` square at ``value`` in the bottom-right corner of every channel."""

    size: int
    value: float

    def stamp(self, x: torch.Tensor) -> torch.Tensor:
        """A copy of the images ``x`` (``[N, C, H, W]``) with the trigger on."""
        out = x.clone()
        out[..., -self.size :, -self.size :] = self.value
        return out


@dataclass(frozen=True)
class Backdoor:
    """The trigger, the target class and the data the malicious clients train on once they attack."""

    trigger: Trigger
    target: int
    training: FederatedData

    @classmethod
    def of(cls, options: dict[str, float], data: FederatedData, bad: np.ndarray, seed: int) -> Backdoor:
        """The backdoor of the malicious clients ``bad`` on ``data``; refused for inputs that are not
        images ``[C, H, W]`` (``adversary.attack``), resampled clients, a target that is not a class or a
        trigger larger than the image (their options)."""
        shape = data.input_shape
        if len(shape) != 3 or not data.x_train.is_floating_point() or data.y_train.dim() != 1:
            raise ConfigError(
                "adversary.attack", f"backdoor stamps images [C, H, W], not inputs {list(shape)}"
            )
        if isinstance(data.client_train, ResampledClients):
            raise ConfigError("adversary.attack", "backdoor needs client shards, not resampled clients")
        target = int(options.get("target", DEFAULTS["target"]))
        if target >= data.num_classes:
            raise ConfigError(
                "adversary.options.target", f"{target} is not among the {data.num_classes} classes"
            )
        size = int(options.get("trigger_size", DEFAULTS["trigger_size"]))
        if size > min(shape[1:]):
            raise ConfigError(
                "adversary.options.trigger_size", f"{size} is larger than the images {list(shape)}"
            )
        trigger = Trigger(size, float(data.x_train.max()))
        fraction = float(options.get("poison_fraction", DEFAULTS["poison_fraction"]))
        return cls(trigger, target, _poisoned_data(data, bad, seed, trigger, target, fraction))

    def success(
        self, model: nn.Module, params: Tensors, buffers: Tensors, data: FederatedData, batch_size: int
    ) -> float:
        """The attack success rate of the model on ``data``'s test set (see :func:`attack_success`)."""
        return attack_success(
            model, params, buffers, data.x_test, data.y_test, self.trigger, self.target, batch_size
        )


def _poisoned_data(
    data: FederatedData, bad: np.ndarray, seed: int, trigger: Trigger, target: int, fraction: float
) -> FederatedData:
    """``data`` with ``round(fraction n_c)`` (at least 1) of each malicious client's ``n_c`` samples
    replaced, in its own index array, by stamped copies labelled ``target``, appended to the tensors."""
    shards = list(data.client_train)
    picked: list[np.ndarray] = []
    start = len(data.y_train)
    for c in bad:
        shard = shards[c].copy()
        count = min(len(shard), max(1, round(fraction * len(shard))))
        where = np.sort(
            numpy_rng(seed, "adversary-backdoor", int(c)).choice(len(shard), count, replace=False)
        )
        picked.append(shard[where])
        shard[where] = start + np.arange(count)
        shards[c], start = shard, start + count
    source = torch.as_tensor(np.concatenate(picked), device=data.device)
    stamped = trigger.stamp(data.x_train[source])
    labels = torch.full((len(source),), target, dtype=data.y_train.dtype, device=data.device)
    view = data.with_labels(torch.cat([data.y_train, labels]))
    view.x_train = torch.cat([data.x_train, stamped])
    view.client_train = shards
    return view


@torch.no_grad()
def attack_success(
    model: nn.Module,
    params: Tensors,
    buffers: Tensors,
    x: torch.Tensor,
    y: torch.Tensor,
    trigger: Trigger,
    target: int,
    batch_size: int,
) -> float:
    """The share of the samples ``(x, y)`` whose label is not ``target`` that ``model`` (in eval mode)
    classifies as ``target`` once ``trigger`` is stamped on them, in batches of ``batch_size`` (0 where
    every label is the target)."""
    others = torch.nonzero(y != target).flatten()
    if not len(others):
        return 0.0
    was_training = model.training
    model.eval()
    hits = 0
    try:
        for start in range(0, len(others), batch_size):
            xb = trigger.stamp(x[others[start : start + batch_size]])
            logits = call_at(model, {**params, **buffers}, (xb,))
            hits += int((logits.argmax(dim=1) == target).sum())
    finally:
        model.train(was_training)
    return hits / len(others)
