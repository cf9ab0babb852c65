"""Scale-out on ``torch.distributed``: one run's clients sharded across processes (docs/scale-out.md).

Algorithms see only :class:`Cohorts` and :class:`Cohort` (:mod:`fedge.distributed.cohort`): which rows
of a set of participants this process runs, and the collectives that put the rows' results back
together exactly as one process would have them. Underneath, a :class:`Group` is the run's view of its
processes: ``SINGLE`` (one process, every collective the identity) or a ``torch.distributed`` process
group started by ``torchrun`` (gloo on CPU, NCCL on GPU). Every rank derives the same cohort and plans
from the seed; :mod:`fedge.distributed.shards` says which rows a rank runs.
"""

from fedge.distributed.cohort import SINGLE_PROCESS, Cohort, Cohorts
from fedge.distributed.group import SINGLE, DistError, Group, TorchGroup, current_group, launched_rank
from fedge.distributed.links import send_rows, send_shard
from fedge.distributed.shards import Shard, balanced, blocks

__all__ = [
    "SINGLE",
    "SINGLE_PROCESS",
    "Cohort",
    "Cohorts",
    "DistError",
    "Group",
    "Shard",
    "TorchGroup",
    "balanced",
    "blocks",
    "current_group",
    "launched_rank",
    "send_rows",
    "send_shard",
]
