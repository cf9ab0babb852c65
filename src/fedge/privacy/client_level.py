"""The planner of client-level DP-FedAvg (:mod:`fedge.aggregation.private`): the releases a whole run's
``gaussian`` (and adaptive ``clip``) stages would make, and its ``gaussian_share`` stages where
``secagg`` sums the shares in a ``gaussian`` reducer's place, so that ``privacy.target_epsilon`` calibrates
their noise and ``stop.max_epsilon`` is checked before round 1.

At a star server (FedAvg and its fine-tuned variant) each round releases one aggregate spending every
client's guarantee, at the round's sampling: Poisson with probability ``algorithm.fraction``
(``privacy.participation: poisson``), ``round(fraction N)`` of ``N`` without replacement, or none when
everyone takes part. At a hierarchy's edge servers (HIST, HFedAvg) every cell releases one aggregate
per edge round, spending its members' guarantees. An adaptive clip adds its count's release alongside
each of these.
"""

from __future__ import annotations

from typing import Any

from fedge.config import RunConfig, StageConfig
from fedge.errors import ConfigError
from fedge.privacy.release import GAUSSIAN, Release
from fedge.privacy.run import Participation

UPDATE = "update"
"""The release kind (and noise purpose) of a server's noisy aggregate."""
EDGE = "edge"
"""The release kind of an edge server's noisy aggregate (and the edge site's name)."""
SECAGG = "secagg"
"""The secure-aggregation reducer, which records a ``gaussian_share`` stage's releases in a
``gaussian`` reducer's place."""
COUNT = "clip_count"
"""The release kind (and noise purpose) of an adaptive clip's noisy count."""
SERVER, CLOUD = "server", "cloud"
"""The aggregation sites a plan is made for, and the hierarchy's one it refuses."""

STAR_ALGORITHMS = ("fedavg", "fedavg_ft")
"""The algorithms whose server draws its clients by the star round (what ``privacy.participation`` sets)."""
HIERARCHICAL_ALGORITHMS = ("hist", "hfedavg")
"""The algorithms whose edge servers aggregate their cells' clients."""


def star_participation(config: RunConfig, num_clients: int) -> Participation:
    """How a star round draws its clients: Poisson with probability ``algorithm.fraction``, else
    ``max(1, round(fraction N))`` of the ``N`` without replacement (all of them: no sampling)."""
    fraction = float(getattr(config.algorithm, "fraction", 1.0))
    if config.privacy.participation == "poisson":
        return Participation("poisson", num_clients, probability=fraction)
    count = max(1, round(fraction * num_clients))
    if count >= num_clients:
        return Participation("none", num_clients)
    return Participation("without_replacement", num_clients, sample_size=count)


def _applies(stage: StageConfig, site: str) -> bool:
    return stage.at is None or site in stage.at


def _site(config: RunConfig, key: str) -> str:
    """Where a client-level stage of this run is accounted, or one line naming ``key``."""
    name = config.algorithm.name
    if name in STAR_ALGORITHMS:
        return SERVER
    if name in HIERARCHICAL_ALGORITHMS:
        return EDGE
    known = ", ".join((*STAR_ALGORITHMS, *HIERARCHICAL_ALGORITHMS))
    raise ConfigError(key, f"client-level noise is accounted for {known}, not {name}")


def _closes(stages: list[StageConfig], site: str) -> str | None:
    """The name of the last stage that applies at ``site`` (its reducer, where that is one)."""
    here = [stage.name for stage in stages if _applies(stage, site)]
    return here[-1] if here else None


def _multiplier(stages: list[StageConfig], gaussian: StageConfig, multiplier: float) -> float:
    """The gaussian stage's multiplier: its own, else a gaussian_share stage's, else ``multiplier``."""
    configured = gaussian.options.get("noise_multiplier")
    if configured is None:
        shares = [s.options.get("noise_multiplier") for s in stages if s.name == "gaussian_share"]
        configured = next((z for z in shares if z is not None), None)
    return multiplier if configured is None else float(configured)


def _released(stages: list[StageConfig], index: int, site: str) -> bool:
    """Whether stage ``index``'s planned release is made at ``site``: a ``gaussian_share``'s where
    ``secagg`` closes the site's pipeline (a ``gaussian`` reducer there plans its own)."""
    return stages[index].name != "gaussian_share" or _closes(stages, site) == SECAGG


def plan_client_level(config: RunConfig, data_sizes: list[int], multiplier: float) -> list[Release]:
    """The client-level releases of a whole run's ``gaussian`` stages, ``gaussian_share`` stages closed
    by ``secagg`` and adaptive ``clip`` stages, at their configured multipliers or, where unset, at
    ``multiplier`` (the calibrated one)."""
    stages = config.aggregation.stages
    if config.privacy.participation == "poisson" and config.algorithm.name not in STAR_ALGORITHMS:
        refused = f"{config.algorithm.name} draws its own clients; poisson is a star round's draw"
        raise ConfigError("privacy.participation", refused)
    planned: list[tuple[str, float, float, int]] = []  # (kind, multiplier, clip, stage index)
    for i, stage in enumerate(stages):
        if stage.name == "gaussian":
            planned.append((UPDATE, _multiplier(stages, stage, multiplier), 1.0, i))
        elif stage.name == "gaussian_share" and any(s.name == SECAGG for s in stages[i + 1 :]):
            configured = stage.options.get("noise_multiplier")
            planned.append((UPDATE, multiplier if configured is None else float(configured), 1.0, i))
        elif stage.name == "clip" and stage.options.get("adaptive"):
            count = stage.options.get("count_noise_multiplier")
            planned.append((COUNT, multiplier if count is None else float(count), 1.0, i))
    if not planned:
        return []
    site = _site(config, f"aggregation.stages.{planned[0][3]}")
    if site == EDGE:  # a hierarchy aggregates at its cloud too, where no client-level release fits
        for i, stage in enumerate(stages):
            noised = (
                stage.name in ("gaussian", "gaussian_share")
                or stage.name == "clip"
                and stage.options.get("adaptive")
            )
            if noised and _applies(stage, CLOUD):
                raise ConfigError(
                    f"aggregation.stages.{i}",
                    f"{stage.name} cannot be accounted at the cloud; set at: [edge]",
                )
    planned = [p for p in planned if _applies(stages[p[3]], site) and _released(stages, p[3], site)]
    clients = len(data_sizes)
    releases: list[Release] = []
    if site == SERVER:
        drawn = star_participation(config, clients)
        sampling: dict[str, Any] = {"sampling": drawn.sampling}
        if drawn.sampling == "poisson":
            sampling["probability"] = drawn.probability
        elif drawn.sampling == "without_replacement":
            sampling.update(population=drawn.population, sample_size=drawn.sample_size)
        for t in range(1, config.rounds + 1):
            for kind, z, clip, _ in planned:
                releases.append(Release(t, kind, "client", GAUSSIAN, z, clip, **sampling))
        return releases
    cells = int(getattr(config.algorithm, "cells", 1))
    per_cell = clients // cells
    edge_rounds = int(getattr(config.algorithm, "edge_rounds", 1))
    for t in range(1, config.rounds + 1):
        for kind, z, clip, _ in planned:
            for j in range(cells):
                members = tuple(range(j * per_cell, (j + 1) * per_cell))
                released = EDGE if kind == UPDATE else kind
                releases.append(
                    Release(t, released, "client", GAUSSIAN, z, clip, count=edge_rounds, clients=members)
                )
    return releases
