"""What a run's mechanisms share (:class:`RunPrivacy`, the context's ``privacy``): the privacy config,
the ledger they record their releases in, the noise multiplier calibrated before the run, and seeded
noise streams.

Noise is drawn from generators named by ``(seed, "privacy-" + purpose, *keys)`` (round, client,
step...), so it never depends on how many other draws came before: both executors, any grouping of
clients and a resumed run add the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedge.config import PrivacyConfig
from fedge.errors import ConfigError
from fedge.privacy.ledger import PrivacyLedger
from fedge.privacy.release import Release, Sampling
from fedge.rng import torch_rng


@dataclass(frozen=True)
class Participation:
    """How a round's clients are drawn from the ``population``: ``poisson`` (each with ``probability``),
    ``without_replacement`` (``sample_size`` of them) or ``none`` (all take part), what a client-level
    release over a round's cohort records as its sampling."""

    sampling: Sampling
    population: int
    probability: float = 1.0
    sample_size: int = 0


@dataclass
class RunPrivacy:
    """The privacy side of a run of ``num_clients`` clients with seed ``seed``."""

    config: PrivacyConfig
    num_clients: int
    seed: int
    calibrated: float | None = None  # the noise multiplier privacy.target_epsilon gave (set before round 1)
    round: int = 0  # the round being trained (set by the context when it opens a round's streams)
    participation: Participation | None = None  # how the star runtime draws a round's clients (it sets it)
    ledger: PrivacyLedger = field(init=False)
    calls: dict[tuple[str, int], int] = field(default_factory=dict)  # training calls per (purpose, round)

    def __post_init__(self) -> None:
        self.ledger = PrivacyLedger(self.num_clients, self.config.delta, self.config.accountant)

    def multiplier(self, configured: float | None, key: str) -> float:
        """The noise multiplier a mechanism uses: its configured one, else the calibrated one (a
        mechanism left unset without ``privacy.target_epsilon`` is refused naming ``key``)."""
        if configured is not None:
            return configured
        if self.calibrated is None:
            raise ConfigError(key, "is unset and privacy.target_epsilon is not given to calibrate it")
        return self.calibrated

    def next_call(self, purpose: str) -> int:
        """Count one more call of ``purpose`` this round (1, 2...): a key that tells apart the noise of
        two calls in one round, the same in every executor."""
        key = (purpose, self.round)
        self.calls[key] = self.calls.get(key, 0) + 1
        return self.calls[key]

    def record(self, release: Release) -> None:
        """Put a release on the ledger."""
        self.ledger.record(release)

    def generator(
        self, purpose: str, *keys: int | str, device: str | torch.device = "cpu"
    ) -> torch.Generator:
        """The seeded noise stream of ``purpose`` and ``keys``."""
        return torch_rng(self.seed, f"privacy-{purpose}", *keys, device=device)

    def gaussian(self, like: torch.Tensor, std: float, purpose: str, *keys: int | str) -> torch.Tensor:
        """Gaussian noise of ``std`` shaped like ``like`` (its dtype and device), from the named stream
        (drawn in float32 on the CPU then moved, so every device adds the same numbers)."""
        gen = self.generator(purpose, *keys)
        noise = torch.randn(like.shape, generator=gen, dtype=torch.float32)
        return noise.mul_(std).to(device=like.device, dtype=like.dtype)
