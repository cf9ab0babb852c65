"""What an algorithm reports: a round's training figures and an evaluation of its model(s).

Every algorithm returns a :class:`RoundReport` from each round and an :class:`Evaluation` from each
evaluation; the runner writes them as one metrics row per evaluated round. The required fields are what
every comparison needs (training loss; test accuracy and loss); anything else an algorithm measures goes
in ``extra`` under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RoundReport:
    """One global round: the mean training loss over what trained, and algorithm-specific figures."""

    train_loss: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The report as metrics-row fields."""
        return {"train_loss": float(self.train_loss), **self.extra}

    def __getitem__(self, field_name: str) -> Any:
        """A field by its metrics-row name."""
        return self.row()[field_name]

    def __contains__(self, field_name: object) -> bool:
        return field_name in self.row()


@dataclass(frozen=True)
class Evaluation:
    """Top-1 accuracy and mean cross-entropy on held-out data, and algorithm-specific figures
    (per-client spread, an auxiliary head's accuracy, a model's sparsity...)."""

    accuracy: float
    loss: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The evaluation as metrics-row fields."""
        return {"accuracy": float(self.accuracy), "loss": float(self.loss), **self.extra}

    def __getitem__(self, field_name: str) -> Any:
        """A field by its metrics-row name."""
        return self.row()[field_name]

    def __contains__(self, field_name: object) -> bool:
        return field_name in self.row()

    def with_extra(self, **extra: Any) -> Evaluation:
        """The same evaluation with more figures."""
        return Evaluation(self.accuracy, self.loss, {**self.extra, **extra})
