"""The privacy ledger: every release of a private quantity a run makes, and the epsilon they spend.

Beside the communication ledger (bits per transfer) and the clock (seconds and joules), the privacy
ledger is the run's third account. Mechanisms record a :class:`~fedge.privacy.release.Release` each
time they release something computed from private data; the ledger groups them into the history of
every guarantee (each client's client-level one, and each client's samples' sample-level one) and asks
the accountant (:mod:`fedge.privacy.accountant`) for epsilon at the run's delta: per round, cumulative,
and what one more round like the last would make it (what ``stop.max_epsilon`` checks). Clients whose
histories are equal share one computation, so a round costs one accounting per distinct history.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from fedge.privacy.accountant import Method, epsilon
from fedge.privacy.release import Release, Unit

UNITS: tuple[Unit, ...] = ("client", "sample", "label")


@lru_cache(maxsize=4096)
def _cached_epsilon(history: frozenset[tuple[tuple[Any, ...], int]], delta: float, method: Method) -> float:
    return epsilon(dict(history), delta, method)


class PrivacyLedger:
    """The releases of a run of ``num_clients`` clients, accounted at ``delta`` by ``method``."""

    def __init__(self, num_clients: int, delta: float = 1e-5, method: Method = "rdp"):
        self.num_clients, self.delta, self.method = num_clients, delta, method
        self.releases: list[Release] = []
        self.round_bound: list[Release] = []  # the most one round can release, where set before the run
        self.schedule: dict[int, list[Release]] = {}  # each round's releases, where the config fixes them

    def record(self, release: Release) -> None:
        """Add a release (a mechanism calls this each time it releases something)."""
        self.releases.append(release)

    def record_all(self, releases: Iterable[Release]) -> None:
        """Add several releases."""
        self.releases.extend(releases)

    @property
    def active(self) -> bool:
        """Whether the run has released anything through a mechanism."""
        return bool(self.releases)

    def histories(self, releases: list[Release], unit: Unit) -> list[frozenset[tuple[tuple[Any, ...], int]]]:
        """Every client's history of ``unit`` over ``releases``."""
        shared: Counter[tuple[Any, ...]] = Counter()
        own: dict[int, Counter[tuple[Any, ...]]] = {}
        for release in releases:
            if release.unit != unit:
                continue
            if release.clients is None:
                shared[release.shape()] += release.count
                continue
            for client in release.clients:
                own.setdefault(client, Counter())[release.shape()] += release.count
        base = frozenset(shared.items())
        histories = []
        for client in range(self.num_clients):
            mine = own.get(client)
            histories.append(base if mine is None else frozenset((shared + mine).items()))
        return histories

    def _epsilons(self, releases: list[Release], unit: Unit) -> list[float]:
        return [_cached_epsilon(h, self.delta, self.method) for h in self.histories(releases, unit)]

    def units(self) -> list[Unit]:
        """The units the run's releases spend."""
        return [unit for unit in UNITS if any(r.unit == unit for r in self.releases)]

    def worst(self, releases: list[Release]) -> dict[str, float]:
        """The largest epsilon over clients, by unit, of ``releases``."""
        return {unit: max(self._epsilons(releases, unit), default=0.0) for unit in self.units()}

    def round_fields(self, t: int) -> dict[str, Any]:
        """A round's metrics fields (empty when the run releases nothing): cumulative ``epsilon`` (the
        largest over units and clients), each unit's, this round's alone, and ``epsilon_next``, what one
        more round like this one (or, where :attr:`round_bound` is set, one at its most; where
        :attr:`schedule` is, the next round's own) would make the cumulative epsilon."""
        if not self.active:
            return {}
        so_far = [r for r in self.releases if r.round <= t]
        this = [r for r in so_far if r.round == t]
        cumulative = self.worst(so_far)
        following = self.schedule.get(t + 1, []) if self.schedule else (self.round_bound or this)
        next_round = self.worst(so_far + [_moved(r, t + 1) for r in following])
        fields: dict[str, Any] = {f"epsilon_{unit}": value for unit, value in cumulative.items()}
        fields.update(
            epsilon=max(cumulative.values(), default=0.0),
            epsilon_round=max(self.worst(this).values(), default=0.0),
            epsilon_next=max(next_round.values(), default=0.0),
        )
        return fields

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` says: delta, the accountant, the worst and per-client epsilons by unit
        (per client only where clients differ), and the releases by kind."""
        if not self.active:
            return {"epsilon": None}
        per_unit = {unit: self._epsilons(self.releases, unit) for unit in self.units()}
        kinds: Counter[str] = Counter()
        for release in self.releases:
            kinds[release.kind] += release.count
        by_kind = {}
        for kind in sorted(kinds):
            chosen = [r for r in self.releases if r.kind == kind]
            by_kind[kind] = max(self.worst(chosen).values(), default=0.0)
        return {
            "epsilon": max(max(values, default=0.0) for values in per_unit.values()),
            "delta": self.delta,
            "accountant": f"dp-accounting {self.method}",
            "epsilon_by_unit": {unit: max(values, default=0.0) for unit, values in per_unit.items()},
            "epsilon_by_kind": by_kind,
            "releases_by_kind": dict(sorted(kinds.items())),
            "epsilon_per_client": {unit: values for unit, values in per_unit.items() if len(set(values)) > 1},
        }

    def state_dict(self) -> dict[str, Any]:
        """The releases, for a checkpoint."""
        return {"releases": [r.row() for r in self.releases]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The releases of a checkpoint."""
        self.releases = [Release.from_row(row) for row in state["releases"]]

    def to_csv(self) -> str:
        """Every release, one line each (``privacy.csv``)."""
        header = list(Release.__dataclass_fields__)
        lines = [",".join(header)]
        for release in self.releases:
            row = release.row()
            clients = row["clients"]
            row["clients"] = "" if clients is None else " ".join(map(str, clients))
            lines.append(",".join(_cell(row[name]) for name in header))
        return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else repr(value)
    return str(value)


def _moved(release: Release, t: int) -> Release:
    """``release`` as if made in round ``t`` (what one more round like the last would release)."""
    return replace(release, round=t)
