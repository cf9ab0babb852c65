"""Before a run: the noise multiplier ``privacy.target_epsilon`` calls for, and the budget check.

Every mechanism has a *planner*: given the config, the clients' dataset sizes and a noise multiplier
for the mechanisms that leave theirs unset, the releases a whole run would make (where the run is random,
the most a client could spend: every client trains every round). fedge calibrates the one multiplier
that makes the worst guarantee's planned epsilon meet the target, by dp-accounting's search, before
round 1; and it refuses, in one line naming the keys, a run whose budget the configuration cannot meet:
a target no multiplier reaches, a target with nothing to calibrate, or a ``stop.max_epsilon`` that a
single round already exceeds.

The asynchronous family's rounds release what the simulated clock dispatches, so the next round may
train a client this one did not: its ledger checks ``stop.max_epsilon`` against one planned round (every
client's job at its most) rather than a repeat of the last round, so the budget is never crossed. A run
whose round is one step (lightweight FedSL, FedSL) records an epoch's releases at its first round, a
schedule the config fixes: its ledger checks the next round's planned releases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fedge.config import RunConfig
from fedge.errors import ConfigError
from fedge.privacy import AccountingError, PrivacyLedger, Release, calibrate, epsilon
from fedge.privacy.client_level import plan_client_level
from fedge.privacy.cut import plan_cut, plan_labels, step_rounds
from fedge.privacy.ledger import UNITS
from fedge.privacy.peer import plan_peer
from fedge.privacy.release import Unit
from fedge.privacy.run import RunPrivacy
from fedge.privacy.sample import ASYNCHRONOUS, check_sample, plan_sample
from fedge.privacy.split_sample import plan_split_sample

Planner = Callable[[RunConfig, list[int], float], list[Release]]
"""(config, client dataset sizes, the multiplier of unset mechanisms) -> a whole run's releases, at
each mechanism's configured multiplier where it has one."""
History = dict[tuple[Any, ...], int]

PLANNERS: tuple[Planner, ...] = (
    plan_cut,
    plan_labels,
    plan_peer,
    plan_sample,
    plan_split_sample,
    plan_client_level,
)
"""Every mechanism's planner (split learning's cut and its labels, peer messages, DP-SGD in the
engine's local step and in split learning's client steps, client-level DP-FedAvg's aggregation
stages)."""


def planned(
    planners: Sequence[Planner], config: RunConfig, sizes: list[int], multiplier: float
) -> list[Release]:
    """Every mechanism's planned releases."""
    return [release for plan in planners for release in plan(config, sizes, multiplier)]


def _ledger(config: RunConfig, clients: int, releases: list[Release]) -> PrivacyLedger:
    ledger = PrivacyLedger(clients, config.privacy.delta, config.privacy.accountant)
    ledger.record_all(releases)
    return ledger


def worst_epsilon(releases: list[Release], config: RunConfig, clients: int) -> float:
    """The largest epsilon over units and clients of ``releases``, by the run's accountant."""
    return max(_ledger(config, clients, releases).worst(releases).values(), default=0.0)


def _worst_guarantee(releases: list[Release], config: RunConfig, clients: int) -> tuple[Unit, int]:
    """The (unit, client) whose guarantee ``releases`` spend the most of."""
    ledger = _ledger(config, clients, releases)
    scored = []
    for unit in UNITS:
        for client, history in enumerate(ledger.histories(releases, unit)):
            if history:
                scored.append((epsilon(dict(history), ledger.delta, ledger.method), unit, client))
    _, unit, client = max(scored)
    return unit, client


def _history_at(
    planners: Sequence[Planner], config: RunConfig, sizes: list[int], unit: Unit, client: int
) -> Callable[[float], History]:
    """The planned history of ``client``'s ``unit`` guarantee as a function of the multiplier."""

    def history(multiplier: float) -> History:
        releases = planned(planners, config, sizes, multiplier)
        return dict(_ledger(config, len(sizes), releases).histories(releases, unit)[client])

    return history


def calibrated(planners: Sequence[Planner], config: RunConfig, sizes: list[int], target: float) -> float:
    """The multiplier whose worst guarantee meets ``target``: dp-accounting's search on the guarantee
    that spends the most, checked over every guarantee (and searched again on a new worst, should the
    multiplier change which one that is)."""
    delta, method, clients = config.privacy.delta, config.privacy.accountant, len(sizes)
    probe = 1.0
    for _ in range(3):
        unit, client = _worst_guarantee(planned(planners, config, sizes, probe), config, clients)
        found = calibrate(_history_at(planners, config, sizes, unit, client), target, delta, method)
        if worst_epsilon(planned(planners, config, sizes, found), config, clients) <= target * (1 + 1e-9):
            return found
        probe = found
    raise AccountingError(f"no single noise multiplier meets epsilon {target:g} for every client")


def prepare(planners: Sequence[Planner], config: RunConfig, sizes: list[int], privacy: RunPrivacy) -> None:
    """Calibrate ``privacy`` to ``privacy.target_epsilon`` (when given), check ``stop.max_epsilon`` (and
    that the algorithm takes the mechanisms configured), and give the asynchronous family's ledger its
    bound on one round."""
    check_sample(config)
    target, budget = config.privacy.target_epsilon, config.stop.max_epsilon
    try:
        if target is not None:
            if planned(planners, config, sizes, 1.0) == planned(planners, config, sizes, 2.0):
                refused = "no mechanism leaves its noise_multiplier unset for it to calibrate"
                raise ConfigError("privacy.target_epsilon", refused)
            privacy.calibrated = calibrated(planners, config, sizes, target)
        one_round = config.model_copy(update={"rounds": 1})
        if config.algorithm.name in ASYNCHRONOUS:  # the next round may train anyone: one round at its most
            privacy.ledger.round_bound = planned(planners, one_round, sizes, privacy.calibrated or 1.0)
        elif step_rounds(config):  # an epoch's releases come at its first round: the plan says which
            for release in planned(planners, config, sizes, privacy.calibrated or 1.0):
                privacy.ledger.schedule.setdefault(release.round, []).append(release)
        if budget is not None:
            first = planned(planners, one_round, sizes, privacy.calibrated or 1.0)
            spent = worst_epsilon(first, config, len(sizes)) if first else 0.0
            if spent > budget:
                raise ConfigError(
                    "stop.max_epsilon",
                    f"one round already spends epsilon {spent:.3g} > {budget:g}; raise the noise multipliers",
                )
    except AccountingError as error:
        raise ConfigError("privacy.target_epsilon" if target is not None else "privacy", str(error)) from None
