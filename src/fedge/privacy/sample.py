"""The releases of DP-SGD in the local step (``privacy.sample``) and their planner.

Every local step releases its batch's noisy sum of clipped per-sample gradients: one sample is in it
or not (add/remove-one), and moves the sum by at most the clip ``C``, so a step is a Gaussian mechanism
of multiplier ``z`` on each sample of its batch. fedge's local training takes shuffled epochs in fixed
batches, every sample in exactly one batch of an epoch, so a round releases each sample once per epoch
(parallel composition over the epoch's disjoint batches; no subsampling amplification is claimed, as
docs/decisions.md says): a client's round is ``count`` releases, the most times any of its samples was
in a batch. The mechanism itself is :mod:`fedge.engine.private_step`.
"""

from __future__ import annotations

from fedge.config import RunConfig
from fedge.errors import ConfigError
from fedge.privacy.release import GAUSSIAN, Release

GRADIENT = "gradient"
"""The release kind of a DP-SGD step's noisy gradient."""
STAR = ("fedavg", "fedavg_ft")
HIERARCHICAL = ("hfedavg", "hist")
DECENTRALIZED = ("afind", "ditto", "dispfl", "federico", "fedfomo", "gossip", "local", "pens")
ASYNCHRONOUS = ("fedasync", "fedbuff", "fedavg_deadline")
SUPPORTED = STAR + HIERARCHICAL + DECENTRALIZED + ASYNCHRONOUS
"""The algorithms whose local step is the engine's shared step, which DP-SGD replaces."""


def passes(size: int, batch: int, drop_last: bool, steps: int | None, epochs: int) -> int:
    """The most times one of ``size`` samples is in a batch of a training call: ``steps`` batches of
    ``batch`` (or ``epochs`` whole epochs) from epochs reshuffled each pass."""
    per_epoch = size // batch if drop_last else -(-size // batch)
    if per_epoch == 0:
        return 0
    return -(-steps // per_epoch) if steps is not None else epochs


def per_round(config: RunConfig, size: int) -> int:
    """The most releases of one sample of a client of ``size`` samples in a round: its training
    calls' :func:`passes` (HIST and HFedAvg: ``edge_rounds`` calls of ``local_steps``, full batches
    where every client has one; Ditto: its personal model's epochs besides the shared model's)."""
    algorithm = config.algorithm
    batch = int(getattr(algorithm, "batch_size", 1))
    if algorithm.name in HIERARCHICAL:
        calls, steps = int(getattr(algorithm, "edge_rounds", 1)), int(getattr(algorithm, "local_steps", 1))
        return calls * passes(size, batch, size >= batch, steps, 1)
    epochs = int(getattr(algorithm, "local_epochs", 1))
    count = passes(size, batch, bool(getattr(algorithm, "drop_last", False)), None, epochs)
    if algorithm.name == "ditto":
        count *= 2
    return count


def split(config: RunConfig) -> bool:
    """Whether the run is split learning, whose client steps have their own DP-SGD and planner
    (:mod:`fedge.privacy.split_sample`)."""
    return bool(getattr(config.algorithm, "split_dp_sgd", False))


def check_sample(config: RunConfig) -> None:
    """Refuse ``privacy.sample`` for an algorithm with neither the shared local step nor split
    learning's client step (centralized training)."""
    if config.privacy.sample is None or split(config):
        return
    if config.algorithm.name not in SUPPORTED:
        supported = ", ".join(SUPPORTED)
        refused = (
            f"{config.algorithm.name} has no DP-SGD local step; use one of {supported} or split learning"
        )
        raise ConfigError("privacy.sample", refused)


def plan_sample(config: RunConfig, data_sizes: list[int], multiplier: float) -> list[Release]:
    """The noisy gradients a whole run would release, at ``privacy.sample.noise_multiplier`` or, where
    that is unset, at ``multiplier`` (the calibrated one): every client trains every round
    (:func:`per_round`).

    For the asynchronous family this is an exact upper bound whatever the simulated clock does: FedBuff
    and FedAsync dispatch a client at most once a round (it is busy from its dispatch until its update
    is merged, which ends a round), each job is ``local_epochs`` epochs (a job in flight at the end is
    counted, as it is trained at its dispatch), and the deadline variant trains its selected clients
    once a round, a straggler's job cut short releasing less. So ``privacy.target_epsilon`` calibrates
    for the fastest possible client, and the ledger's epsilon is what the jobs made released."""
    sample = config.privacy.sample
    if sample is None or split(config):
        return []
    if sample.noise_multiplier is not None:
        multiplier = sample.noise_multiplier
    return [
        Release(t, GRADIENT, "sample", GAUSSIAN, multiplier, sample.clip, count=count, clients=(c,))
        for t in range(1, config.rounds + 1)
        for c, size in enumerate(data_sizes)
        if (count := per_round(config, size))
    ]
