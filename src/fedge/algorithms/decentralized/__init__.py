"""Decentralized family: AFIND+ and its baselines on peer-to-peer topologies (one module per algorithm)."""

from fedge.algorithms.decentralized import (  # noqa: F401  (registration)
    afind,
    dispfl,
    ditto,
    fedavg_ft,
    federico,
    fedfomo,
    gossip,
    local,
    pens,
)
