"""The ``secagg`` stage of a deployed run, read as Flower's SecAgg+ (Bell et al., CCS 2020, on Bonawitz
et al.'s double masking, CCS 2017): which runs may carry it, and the settings of Flower's
:class:`~flwr.server.workflow.SecAggPlusWorkflow` each of its options becomes.

The mapping, for a round of ``n`` senders:

- ``bits`` -> ``modulus_range = 2^bits`` (Flower adds and masks modulo it; at most 32 bits, Flower's
  limit), and ``quantization_range = (2^bits - 1) // n``: each sender's quantized row lies in
  ``[0, quantization_range]``, so the sum of ``n`` of them (and of their weight factors) cannot wrap,
  the guarantee fedge's fraction bits give its fixed point.
- ``range`` -> ``clipping_range``.
- ``neighbours`` (SecAgg+'s even degree ``k``) -> ``num_shares = k + 1`` (a sender and its ``k``
  neighbours on Flower's ring); unset, or ``k + 1 >= n``: every sender (``num_shares = 1.0``).
- ``threshold`` -> ``reconstruction_threshold`` (unset: fedge's default, a majority of the ``k + 1``).
- the weights: each node reports its sample count as ``num_examples``; ``max_weight`` is the largest
  count of the round, so every weight factor is at most 1 and the quantization loses least.

What cannot map is refused in one line naming the key: more than 32 bits, a simulated ``dropout`` (a
deployed round's dropouts are the nodes that really fail, and Flower's shares recover them),
``rounding: nearest`` (Flower always rounds stochastically), ``threshold: 1`` (Flower reads 1 as every
share), another stage next to ``secagg`` (a transform before it acts on each sender's row, which the
server never holds), kept client optimizer states, and any algorithm outside the star
family (FedAvg and FedAvg-FT: one upload per participant a round, summed by the server).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedge.aggregation import sites
from fedge.aggregation.pipeline import build_pipeline
from fedge.aggregation.secure import SecureAggregation
from fedge.aggregation.secure_protocol import default_threshold
from fedge.config import RunConfig
from fedge.errors import ConfigError

STAGE = "secagg"
STAR = ("fedavg", "fedavg_ft")
"""The algorithms whose ``secagg`` deploys on Flower's SecAgg+: a server summing one upload per
participant a round."""
MAX_BITS = 32
"""Flower's ``modulus_range`` is at most ``2^32`` (its masks are numpy int64 sums of ``n`` of them)."""


@dataclass(frozen=True)
class SecAggOptions:
    """The ``secagg`` stage's options a deployment carries (``key``: the stage's config key)."""

    key: str
    bits: int
    range: float
    neighbours: int | None
    threshold: int | None

    def settings(self, n: int, max_weight: float) -> dict[str, int | float]:
        """The keywords of Flower's ``SecAggPlusWorkflow`` for a round of ``n`` senders whose largest
        weight (sample count) is ``max_weight``."""
        if n < 2:
            raise ConfigError("algorithm.fraction", f"secagg needs at least 2 participants a round, got {n}")
        modulus = 2**self.bits
        quantization = (modulus - 1) // n
        if quantization < 2:
            raise ConfigError(f"{self.key}.options.bits", f"{self.bits} bits leave no room for {n} senders")
        holders = n if self.neighbours is None else min(self.neighbours + 1, n)
        everyone = holders == n
        threshold = default_threshold(holders - 1) if self.threshold is None else self.threshold
        if threshold > holders or (not everyone and threshold >= holders):
            limit = f"at most {holders}" if everyone else f"below the {holders} holders (Flower's rule)"
            raise ConfigError(
                f"{self.key}.options.threshold", f"{threshold} must be {limit} with {n} senders"
            )
        return {
            "num_shares": 1.0 if everyone else holders,
            "reconstruction_threshold": threshold,
            "clipping_range": self.range,
            "quantization_range": quantization,
            "modulus_range": modulus,
            "max_weight": float(max_weight),
        }


def secagg_options(config: RunConfig) -> SecAggOptions | None:
    """The deployed run's ``secagg`` options (None: it has no such stage), or a ConfigError naming the
    key a deployment cannot carry."""
    stages = config.aggregation.stages
    index = next((i for i, stage in enumerate(stages) if stage.name == STAGE), None)
    if index is None:
        return None
    key = f"aggregation.stages.{index}"
    if config.algorithm.name not in STAR:
        why = f"Flower's SecAgg+ deploys with {', '.join(STAR)}, not {config.algorithm.name}"
        raise ConfigError(f"{key}.name", f"secagg cannot be deployed: {why}")
    stage = stages[index]
    if stage.at is not None and sites.SERVER not in stage.at:
        raise ConfigError(f"{key}.at", "a deployed secagg runs at the server")
    for j, other in enumerate(stages):
        if j != index:
            why = "the server never holds a row to apply it to under Flower's SecAgg+"
            raise ConfigError(
                f"aggregation.stages.{j}.name", f"{other.name!r} cannot be deployed with secagg: {why}"
            )
    built = build_pipeline(config.aggregation, sites.SERVER).reducer  # the stage's own option checks
    assert isinstance(built, SecureAggregation)
    refusals = {
        "bits": (built.bits > MAX_BITS, f"at most {MAX_BITS} with Flower's SecAgg+"),
        "dropout": (bool(built.dropout), "a deployed round's dropouts are the nodes that fail; set it to 0"),
        "rounding": (
            stage.options.get("rounding", "stochastic") != "stochastic",
            "Flower's SecAgg+ rounds stochastically; leave it unset or set stochastic",
        ),
        "threshold": (built.threshold == 1, "Flower's SecAgg+ reads 1 as every share; use 2 or more"),
    }
    for option, (refused, why) in refusals.items():
        if refused:
            value = stage.options[option]
            raise ConfigError(f"{key}.options.{option}", f"{value!r} cannot be deployed: {why}")
    if getattr(config.algorithm, "client_optimizer_state", "reset") != "reset":
        why = "cannot be deployed with secagg: the states would have to come back beside the masked rows"
        raise ConfigError("algorithm.client_optimizer_state", why)
    secure = SecAggOptions(key, built.bits, built.bound, built.neighbours, built.threshold)
    if config.privacy.participation != "poisson":  # a fixed cohort: its settings must map before any start
        fraction = float(getattr(config.algorithm, "fraction", 1.0))  # FedAvg and FedAvg-FT have it
        secure.settings(max(1, round(fraction * config.partition.num_clients)), 1.0)
    return secure
