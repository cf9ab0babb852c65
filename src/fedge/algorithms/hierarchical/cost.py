"""The paper's analytic communication cost per client (HIST Tables I-II), to check the ledger against.

A client uploads its submodel once per edge round, ``E`` times per global round: HIST clients hold the
shared values plus ``1/N`` of the partitioned ones, HFedAvg clients the whole model. Tables I and II
report this cumulative uplink volume of one client, in MB of 2^20 bytes at 4 bytes per value.
"""

from __future__ import annotations

BITS_PER_MB = 8 * 2**20


def client_upload_values(
    rounds: int, edge_rounds: int, shared: float, partitioned: float, cells: int
) -> float:
    """Values one client uploads in ``rounds`` global rounds with equal submodels (``cells = 1``: HFedAvg)."""
    return rounds * edge_rounds * (shared + partitioned / cells)


def client_upload_mb(
    rounds: int, edge_rounds: int, model_mb: float, shared: float, partitioned: float, cells: int
) -> float:
    """MB one client uploads, scaling the model's quoted size by the submodel's share of its values
    (how the paper's Tables I-II come out)."""
    share = (shared + partitioned / cells) / (shared + partitioned)
    return rounds * edge_rounds * model_mb * share


def values_mb(values: float, bits_per_value: int = 32) -> float:
    """MB of ``values`` values."""
    return values * bits_per_value / BITS_PER_MB
