"""The planner of DP-SGD in split learning's client steps (``privacy.sample`` on the split family).

Each round a client makes one sample-level release: its client-side updates of the round, each a
Gaussian mechanism on the batch's clipped per-sample gradients. fedge's batches are shuffled epochs of
disjoint batches, so a sample is in one step per epoch: the round counts one release per epoch
(parallel composition over the epoch's batches), with no claim of amplification by sampling, plus
CSE-FSL's server-backprop batch in a server round. Where a round is one step (lightweight FedSL,
FedSL) the epoch spans rounds and its release is planned at its first round. Without ``privacy.cut``
the smashed data a client sends carries no noise: planned (and recorded) as a release without noise,
whose epsilon is infinite.
"""

from __future__ import annotations

from fedge.config import RunConfig
from fedge.errors import ConfigError
from fedge.privacy.cut import begins_pass, draws_per_round, planned_sends, round_batches
from fedge.privacy.release import GAUSSIAN, Release


def planned_uses(config: RunConfig, size: int) -> int:
    """The most client steps one sample of a client of ``size`` samples can be in during a round: once per
    epoch of the round's batches, one more for CSE-FSL's server-backprop batch, times the draws of one
    client a round can hold (independent draws with replacement)."""
    uses, batches = round_batches(config, size)
    if batches == 0:
        return 0
    if getattr(config.algorithm, "zb_step", "aux") == "server_backprop":
        uses += 1
    return uses * draws_per_round(config)


def plan_split_sample(config: RunConfig, data_sizes: list[int], multiplier: float) -> list[Release]:
    """A split run's DP-SGD releases (at ``privacy.sample.noise_multiplier``, else ``multiplier``) and,
    without ``privacy.cut``, its smashed data's releases without noise: every client every round. No
    target epsilon is met with smashed data in clear: refused, naming ``privacy.target_epsilon``."""
    sample = config.privacy.sample
    if sample is None or not getattr(config.algorithm, "split_dp_sgd", False):  # the split family's mark
        return []
    if config.privacy.cut is None and config.privacy.target_epsilon is not None:
        reason = "smashed data sent without privacy.cut has an infinite epsilon; set privacy.cut"
        raise ConfigError("privacy.target_epsilon", reason)
    z = sample.noise_multiplier if sample.noise_multiplier is not None else multiplier
    releases = []
    for t in range(1, config.rounds + 1):
        for c, size in enumerate(data_sizes):
            if not begins_pass(config, size, t):  # one-step rounds: the epoch's release is at its first
                continue
            uses = planned_uses(config, size)
            if uses:
                releases.append(
                    Release(t, "gradient", "sample", GAUSSIAN, z, sample.clip, count=uses, clients=(c,))
                )
            sends = planned_sends(config, size)
            if config.privacy.cut is None and sends:
                releases.append(Release(t, "smashed", "sample", GAUSSIAN, 0.0, count=sends, clients=(c,)))
    return releases
