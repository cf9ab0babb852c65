"""Updates: what a node receives for one aggregation, as stacked rows and the weights it gives them.

A server, an edge, a cloud or a peer turns the models (or model deltas) it received into new state. In
fedge they arrive stacked, one leading row per sender, so the moment "updates arrive -> the new model"
is one value for every aggregation site: the rows, each output's weight on each row, and the model the
senders started from. Stages of an :class:`~fedge.aggregation.pipeline.Pipeline` transform it and a
reducer turns it into the new state.

Rows may come in several *parts* that each output weighs separately: a peer mixes its own row exactly
and every other row as that peer's message decoded, and a process of a multi-process run holds only its
own rows. Keeping the parts apart keeps the arithmetic every site had (a sum of per-part products) while
a reducer that needs every row at once reads :meth:`Updates.joined`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fedge.tensors import Tensors


@dataclass(frozen=True)
class Part:
    """Stacked ``rows`` (``R`` leading rows per tensor) and ``weights`` on them: ``[R]`` for a site with
    one output (a server's model), ``[n_out, R]`` for a site with one output per receiver (peers).

    ``masks`` (0/1, shaped like the rows of the tensors they name) say which coordinates each row
    holds, for sparse models (Dis-PFL's personal masks): the site's mean then averages each coordinate
    over the rows that hold it (:class:`~fedge.aggregation.means.WeightedMean`). ``senders`` are the
    client ids of the rows where the site knows them (what a per-client noise share or mask is keyed
    by).
    """

    rows: Tensors
    weights: torch.Tensor
    masks: Tensors = field(default_factory=dict)
    senders: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        count = self.weights.shape[-1]
        wrong = [name for name, t in self.rows.items() if t.shape[0] != count]
        if wrong:
            raise ValueError(f"rows of {wrong[0]!r} do not match the {count} weights")
        unshaped = [name for name, m in self.masks.items() if m.shape != self.rows[name].shape]
        if unshaped:
            raise ValueError(f"the mask of {unshaped[0]!r} is not shaped like its rows")


@dataclass(frozen=True)
class Updates:
    """The stacked updates of one aggregation at ``site`` in round ``round``.

    ``parts`` hold the rows and weights (see :class:`Part`); ``reference`` is the state the senders
    started from where the site has one (the broadcast global model of a server; ``None`` elsewhere):
    what a stage that works on deltas (clipping, say) measures the rows against. ``clip`` is the L2
    bound a clipping stage put on every row's change from the reference (``None``: unbounded), and
    ``noise`` the noise multiplier of the Gaussian shares the rows already carry (``None``: none), what
    a noise-adding reducer reads.
    """

    site: str
    round: int
    parts: tuple[Part, ...]
    reference: Tensors | None = field(default=None)
    clip: float | None = None
    noise: float | None = None

    @classmethod
    def of(
        cls,
        site: str,
        round_: int,
        rows: Tensors,
        weights: torch.Tensor,
        reference: Tensors | None = None,
        senders: tuple[int, ...] | None = None,
    ) -> Updates:
        """Updates of one part (``senders``: the rows' client ids, where known)."""
        return cls(site, round_, (Part(rows, weights, senders=senders),), reference)

    @classmethod
    def of_deltas(cls, site: str, round_: int, deltas: Tensors, weights: torch.Tensor) -> Updates:
        """Updates whose rows are changes to a model (one part): their reference is no change, zeros."""
        return cls.of(site, round_, deltas, weights, {k: torch.zeros_like(v[0]) for k, v in deltas.items()})

    @property
    def per_receiver(self) -> bool:
        """Whether each receiver gets its own output (two-dimensional weights)."""
        return self.parts[0].weights.dim() == 2

    def joined(self) -> Part:
        """Every part's rows and weights concatenated along the rows (one part), for a reducer that needs
        all rows at once."""
        if len(self.parts) == 1:
            return self.parts[0]
        names = self.parts[0].rows
        rows = {name: torch.cat([part.rows[name] for part in self.parts]) for name in names}
        weights = torch.cat([part.weights for part in self.parts], dim=-1)
        masked = self.parts[0].masks
        masks = {name: torch.cat([part.masks[name] for part in self.parts]) for name in masked}
        known = all(part.senders is not None for part in self.parts)
        senders = tuple(s for part in self.parts for s in part.senders or ()) if known else None
        return Part(rows, weights, masks, senders)

    def with_parts(self, *parts: Part) -> Updates:
        """The same updates with other rows or weights (what a transforming stage returns)."""
        return replace(self, parts=parts)
