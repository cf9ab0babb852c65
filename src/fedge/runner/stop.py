"""Stop rules and time to target, read from a run's per-round records alone.

Every rule is a pure function of the rows so far, so a resumed run stops exactly where an
uninterrupted one does, and a finished run's summary can say which rule ended it. Budgets (MB,
simulated seconds) are checked on every round; accuracy rules only on evaluated rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedge.config import StopConfig
from fedge.runner.records import evaluated

MIB = 8 * 2**20  # bits in one MB (2^20 bytes)
RULES = ("target_accuracy", "max_mb", "max_sim_seconds", "max_epsilon", "patience")
TARGET_FIELDS = ("round", "mb_total", "sim_seconds", "wall_seconds")  # what "time to target" reports


@dataclass(frozen=True)
class Stop:
    """Why a run ended early: the rule and the round at which it held."""

    rule: str
    round: int


def mb_of(row: dict[str, Any], link: str) -> float:
    """Cumulative MB of ``link`` in a row: ``total``, ``up``, ``down``, ``peer`` or a ledger kind."""
    if link == "total":
        return row["mb_total"]
    if link in ("up", "down", "peer"):
        return row[f"bits_{link}"] / MIB
    return row["bits_by_kind"].get(link, 0) / MIB


def over_budget(cfg: StopConfig, row: dict[str, Any]) -> str | None:
    """The budget rule (``max_mb``, ``max_sim_seconds`` or ``max_epsilon``) a round's record reaches, if
    any. A privacy budget is never crossed: the run stops after the round whose successor, releasing
    what it released, would take the epsilon past ``max_epsilon`` (``epsilon_next``)."""
    budgets = {"total": cfg.max_mb} if isinstance(cfg.max_mb, float | int) else cfg.max_mb or {}
    if any(mb_of(row, link) >= limit for link, limit in budgets.items()):
        return "max_mb"
    if cfg.max_sim_seconds is not None and row["sim_seconds"] >= cfg.max_sim_seconds:
        return "max_sim_seconds"
    if cfg.max_epsilon is not None and row.get("epsilon_next", 0.0) > cfg.max_epsilon:
        return "max_epsilon"
    return None


def _patience_ran_out(cfg: StopConfig, scored: list[dict[str, Any]]) -> bool:
    best, since = float("-inf"), 0
    for row in scored:
        if row["accuracy"] > best + cfg.min_delta:
            best, since = row["accuracy"], 0
        else:
            since += 1
    return since >= cfg.patience


def check(cfg: StopConfig, rows: list[dict[str, Any]]) -> Stop | None:
    """The rule that ends the run after its last row, if one holds (in the order of :data:`RULES`)."""
    if not rows:
        return None
    last = rows[-1]
    if "accuracy" in last and cfg.target_accuracy is not None and last["accuracy"] >= cfg.target_accuracy:
        return Stop("target_accuracy", last["round"])
    budget = over_budget(cfg, last)
    if budget is not None:
        return Stop(budget, last["round"])
    if "accuracy" in last and cfg.patience is not None and _patience_ran_out(cfg, evaluated(rows)):
        return Stop("patience", last["round"])
    return None


def first_reached(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """Round, MB and simulated (and wall) seconds of the first evaluated round at or above ``target``."""
    for row in evaluated(rows):
        if row["accuracy"] >= target:
            return {key: row[key] for key in TARGET_FIELDS if key in row}
    return None


def targets(cfg: StopConfig) -> list[float]:
    """The accuracy levels a summary times: ``targets`` and ``target_accuracy``, sorted, once each."""
    levels = set(cfg.targets)
    if cfg.target_accuracy is not None:
        levels.add(cfg.target_accuracy)
    return sorted(levels)


def summary_fields(cfg: StopConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a summary says about stopping: the rule (``rounds`` when none fired) and time to target."""
    stop = check(cfg, rows)
    return {
        "stopped_by": stop.rule if stop else "rounds",
        "time_to_target": {f"{level:g}": first_reached(rows, level) for level in targets(cfg)},
    }
