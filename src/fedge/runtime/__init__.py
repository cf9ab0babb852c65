"""The round runtime every algorithm is handed: its build context (:class:`Context`, with the aggregation
pipeline of each site), availability-aware participant draws, and the star round of a server and its
clients (:mod:`.star`)."""

from fedge.runtime.context import Context
from fedge.runtime.star import StarRound, StarRuntime, sample_clients

__all__ = ["Context", "StarRound", "StarRuntime", "sample_clients"]
