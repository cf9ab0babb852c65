"""A release: one output of a randomised mechanism computed from private data, as the privacy ledger
records it (what was released, whose privacy it spends, the mechanism and its parameters).

fedge never composes privacy losses itself: :meth:`Release.event` turns a release into the event of
Google's ``dp-accounting`` library that describes it, and :mod:`fedge.privacy.accountant` hands the
events to that library's accountants.

Neighbouring datasets. A Gaussian release on Poisson-sampled data is accounted under add/remove-one
(one client or sample more or less), the relation its analysis is tight for. Sampling a fixed number
without replacement, and randomized response, are analysed under replace-one, where one contribution
clipped to norm ``C`` moves a clipped sum by up to ``2C``: a history that holds such a release is
accounted under replace-one throughout, with every Gaussian's multiplier halved (std / 2C).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import dp_accounting as dpa

Unit = Literal["client", "sample", "label"]
"""Whose privacy a release spends: a whole client's data (client-level DP), one sample's, or one
sample's label alone (label DP: neighbouring datasets differ in one label, the features being the
server's to see, as in split learning's label sharing)."""
Sampling = Literal["none", "poisson", "without_replacement"]
"""How the released contributions were drawn: all of them, each independently with a probability, or a
fixed number uniformly without replacement."""

GAUSSIAN = "gaussian"
RANDOMIZED_RESPONSE = "randomized_response"
MECHANISMS = (GAUSSIAN, RANDOMIZED_RESPONSE)


@dataclass(frozen=True)
class Release:
    """``count`` identical releases in round ``round`` of ``kind`` (``update``, ``gradient``,
    ``smashed``, ``cut_gradient``, ``label``, ``peer``, ``edge``, ``aircomp``...).

    ``mechanism`` is ``gaussian`` (``noise_multiplier``: the noise's std over the sensitivity ``clip``
    under add/remove-one) or ``randomized_response`` (``noise_multiplier``: the probability that the
    true value is replaced by a uniform draw over ``buckets`` values). ``sampling`` with
    ``probability`` (Poisson) or ``sample_size`` of ``population`` (without replacement) is how the
    contributions were drawn. ``clients`` are the clients whose guarantee it spends (``None``: all).
    """

    round: int
    kind: str
    unit: Unit
    mechanism: str
    noise_multiplier: float
    clip: float = 1.0
    sampling: Sampling = "none"
    probability: float = 1.0
    population: int = 0
    sample_size: int = 0
    buckets: int = 0
    count: int = 1
    clients: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown mechanism {self.mechanism!r}; known: {', '.join(MECHANISMS)}")
        if self.mechanism == RANDOMIZED_RESPONSE and not 0.0 <= self.noise_multiplier <= 1.0:
            raise ValueError("a randomized response's replacement probability is in [0, 1]")
        if self.sampling == "without_replacement" and not 0 < self.sample_size <= self.population:
            raise ValueError("sampling without replacement needs 0 < sample_size <= population")

    @property
    def replace_one(self) -> bool:
        """Whether its analysis needs the replace-one relation (see the module's note)."""
        return self.mechanism == RANDOMIZED_RESPONSE or self.sampling == "without_replacement"

    def shape(self) -> tuple[Any, ...]:
        """What the epsilon depends on (two releases of one shape compose as one release of both counts)."""
        return (
            self.mechanism,
            float(self.noise_multiplier),
            self.sampling,
            float(self.probability),
            self.population,
            self.sample_size,
            self.buckets,
        )

    def row(self) -> dict[str, Any]:
        """The release as a plain record (checkpoints, ``privacy.csv``)."""
        out = asdict(self)
        out["clients"] = None if self.clients is None else list(self.clients)
        return out

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Release:
        """A release from :meth:`row`'s record."""
        clients = row.get("clients")
        return cls(**{**row, "clients": None if clients is None else tuple(int(c) for c in clients)})


def shape_event(shape: tuple[Any, ...], replace_one: bool) -> dpa.DpEvent:
    """The ``dp-accounting`` event of one release of ``shape`` (:meth:`Release.shape`), under
    replace-one (``replace_one``) or add/remove-one."""
    mechanism, multiplier, sampling, probability, population, sample_size, buckets = shape
    if mechanism == RANDOMIZED_RESPONSE:
        return dpa.RandomizedResponseDpEvent(multiplier, buckets)
    if multiplier == 0.0:
        return dpa.NonPrivateDpEvent()
    base = dpa.GaussianDpEvent(multiplier / 2 if replace_one else multiplier)
    if sampling == "poisson":
        return dpa.PoissonSampledDpEvent(probability, base)
    if sampling == "without_replacement":
        return dpa.SampledWithoutReplacementDpEvent(population, sample_size, base)
    return base
