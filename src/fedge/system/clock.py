"""The simulated clock: cumulative seconds and joules of a run, advanced by the algorithms."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Clock:
    """Simulated time and energy so far; each algorithm composes a round's latency as its paper says."""

    seconds: float = 0.0
    joules: float = 0.0

    def advance(self, seconds: float, joules: float = 0.0) -> None:
        self.seconds += float(seconds)
        self.joules += float(joules)

    def state_dict(self) -> dict[str, float]:
        return {"seconds": self.seconds, "joules": self.joules}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.seconds, self.joules = float(state["seconds"]), float(state["joules"])
