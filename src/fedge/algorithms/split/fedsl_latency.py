"""Lightweight FedSL's latency figures as we read the paper's Fig. 4 (it models communication only)."""

from __future__ import annotations

from fedge.system import SystemModel


def cut_latency(
    system: SystemModel,
    round_: int,
    batch: int,
    smashed_values: int,
    p: float,
    value_bits: int = 32,
    label_bits: int = 32,
) -> float:
    """Fig. 4's per-round latency as we read it, in expectation: slowest client's smashed data (a ``1 - p``
    share of ``smashed_values`` per sample) and labels up, plus the gradient of the kept values down."""
    kept = batch * smashed_values * (1.0 - p) * value_bits
    link = system.link(round_)
    return float(((kept + batch * label_bits) / link.up_bps + kept / link.down_bps).max())


def aggregation_latency(system: SystemModel, round_: int, model_bits: float) -> float:
    """``T_agg``: the slowest client-model upload, then the broadcast to the slowest receiver."""
    link = system.link(round_)
    return float(model_bits / link.up_bps.min() + model_bits / link.down_bps.min())
