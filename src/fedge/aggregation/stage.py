"""The two kinds of aggregation stage: a transform (updates in, updates out) and a reducer (updates in,
the new state out).

A :class:`~fedge.aggregation.pipeline.Pipeline` applies its transforms in order and closes with one
reducer. Clipping, noise, masking for secure aggregation and compression are transforms; a mean, a
coordinate-wise median, a trimmed mean or Krum is a reducer. A user's own stage subclasses one of the
two and is registered with :func:`fedge.register_stage` (or an entry point in the ``fedge.stages``
group), then named in the config's ``aggregation.stages``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fedge.aggregation.updates import Updates
from fedge.comm import Network
from fedge.privacy.run import RunPrivacy
from fedge.system import SystemModel
from fedge.tensors import Tensors


@dataclass(frozen=True)
class StageRun:
    """What a stage may read of its run, given once when its pipeline is built (:meth:`Transform.bind`):
    its site, the run seed, the run's privacy side (the ledger a mechanism records its releases in,
    its seeded noise streams and calibrated noise multiplier), the run's network (whose ledger a
    stage that exchanges messages of its own records them on) and system (whose clock it charges for
    its own compute), each ``None`` outside a run, and the stage's config key (what a refusal names)."""

    site: str
    seed: int = 0
    privacy: RunPrivacy | None = None
    network: Network | None = None
    system: SystemModel | None = None
    key: str = "aggregation.stages"


class OptionError(ValueError):
    """A stage's refusal of one of its options: the config error then names
    ``aggregation.stages.N.options.<option>``."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


class Bindable:
    """A stage that reads its run: :meth:`bind` is called once, before the first aggregation."""

    def bind(self, run: StageRun) -> None:
        """Keep what the stage needs of ``run`` (by default nothing)."""

    def state_dict(self) -> dict[str, Any]:
        """What the stage carries from one aggregation to the next (an adaptive clip's bound, say), for
        the run's checkpoint; empty for a stage without state (the default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state_dict`'s state on a resume (by default there is none)."""

    def check_pipeline(self, stages: Sequence[Stage]) -> None:
        """Raise ``ValueError`` (why, in a few words) if the stage cannot work in a pipeline of ``stages``
        (its site's, in order, this one among them, the reducer last): a noise share whose reducer
        would leave it unaccounted, say. Called once the site's pipeline is built; by default any."""


class Transform(Bindable, ABC):
    """A stage that changes the updates before they are reduced (rows, weights or both)."""

    @abstractmethod
    def apply(self, updates: Updates) -> Updates:
        """The updates as the next stage receives them."""


class Reducer(Bindable, ABC):
    """The stage that closes a pipeline: the new state from the updates.

    For one output (``updates.per_receiver`` false) each tensor comes back without the row dimension;
    for one output per receiver, with ``n_out`` leading rows. A reducer may leave a tensor out (an
    integer counter that cannot be averaged, say): the site then keeps that tensor's own value.
    ``additive`` says the reduction is a sum over the rows (a weighted mean is); on a run whose rows are
    spread over processes each process then reduces its own rows and the partial results are added,
    where any other reducer sees every process's rows. ``records_shares`` says the reducer accounts the
    Gaussian shares its rows carry (``updates.noise``: it records their client-level releases), what a
    ``gaussian_share`` stage needs of the reducer after it. ``carries_upload`` says the reducer puts its
    senders' upload of the rows on the ledger itself (secure aggregation's masked vectors): the site's
    runtime then hands it the rows without recording their plain upload, so each upload counts once.
    """

    additive: ClassVar[bool] = False
    records_shares: ClassVar[bool] = False
    carries_upload: ClassVar[bool] = False

    @abstractmethod
    def reduce(self, updates: Updates) -> Tensors:
        """The new state from ``updates``."""


Stage = Transform | Reducer
