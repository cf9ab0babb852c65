"""A finished run as the attacks read it: its config, its recorded transfers and, when an attack needs
them, its data and final model rebuilt read-only from the run directory (nothing in it changes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.algorithms.base import Algorithm
from fedge.algorithms.split.parts import SplitParts, composed
from fedge.config import RunConfig
from fedge.errors import FedgeError
from fedge.extend import load_config
from fedge.files import results
from fedge.runner import checkpoint
from fedge.runner.loop import Built, build_run
from fedge.runner.transfers import recorded_rounds, round_path
from fedge.tensors import Tensors


class AttackError(FedgeError):
    """An attack cannot run on this run directory (what it needs was not recorded)."""


@dataclass
class RunView:
    """The run in ``run_dir``: its config and recorded rounds (``rounds``: those the attacks read; all)."""

    run_dir: Path
    rounds: list[int] | None = None
    _records: dict[int, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    @cached_property
    def config(self) -> RunConfig:
        path = self.run_dir / results.CONFIG
        if not path.is_file():
            raise AttackError(f"{self.run_dir}: not a run directory (no {results.CONFIG})")
        return load_config(path)

    @cached_property
    def recorded(self) -> list[int]:
        """The recorded rounds the attacks read."""
        held = recorded_rounds(self.run_dir)
        if self.rounds is None:
            return held
        missing = [t for t in self.rounds if t not in held]
        if missing:
            raise AttackError(f"{self.run_dir}: round {missing[0]} was not recorded (recorded: {held})")
        return list(self.rounds)

    def record(self, t: int) -> dict[str, np.ndarray]:
        """Round ``t``'s record, loaded once."""
        if t not in self._records:
            with np.load(round_path(self.run_dir, t), allow_pickle=False) as held:
                self._records[t] = {name: held[name] for name in held.files}
        return self._records[t]

    def keys(self, t: int) -> set[str]:
        """What round ``t``'s record holds (read from the file's index; no array is loaded)."""
        if t in self._records:
            return set(self._records[t])
        with np.load(round_path(self.run_dir, t), allow_pickle=False) as held:
            return set(held.files)

    def need(self, attack: str, kind: str, key: str) -> list[int]:
        """The rounds whose record holds ``key``; a one-line refusal naming ``output.record`` when none
        does."""
        rounds = [t for t in self.recorded if key in self.keys(t)]
        if not rounds:
            raise AttackError(
                f"{self.run_dir}: {attack} needs the run to record {kind} "
                f"(output.record: [{kind}]); it recorded {self.config.output.record or 'nothing'}"
            )
        return rounds

    def pooled(self, rounds: list[int], *keys: str) -> list[torch.Tensor]:
        """``keys`` of the records of ``rounds``, concatenated over the rounds."""
        return [torch.from_numpy(np.concatenate([self.record(t)[key] for t in rounds])) for key in keys]

    @cached_property
    def built(self) -> Built:
        """The run rebuilt from its config (data, model, algorithm at round 0); no file is written."""
        if self.config.data.name == "custom":
            raise AttackError(f"{self.run_dir}: the run's data came from the Python API; pass it there")
        with torch.random.fork_rng():
            return build_run(self.config, force=True)

    @cached_property
    def final(self) -> Algorithm[Any]:
        """The algorithm with its last checkpoint's state (the model the run ends with)."""
        path = self.run_dir / results.CHECKPOINT
        if not path.is_file():
            raise AttackError(f"{self.run_dir}: membership inference needs the run's checkpoint")
        saved = checkpoint.load(path, self.config)
        algorithm = self.built.algorithm
        algorithm.load_state_dict(saved.state["algorithm"])
        return algorithm

    def released_model(self) -> tuple[nn.Module, Tensors]:
        """The model the run ends with (a FedAvg server's global model; a split run's trunk composed with
        its server part) and its state; a refusal for families with no single model."""
        algorithm = self.final
        params = getattr(algorithm, "params", None)
        if params is not None and hasattr(algorithm, "model"):
            return getattr(algorithm, "model"), {**params, **getattr(algorithm, "buffers")}  # noqa: B009
        parts = getattr(algorithm, "parts", None)
        if isinstance(parts, SplitParts):
            server_params, server_buffers = getattr(algorithm, "server").evaluation_model()  # noqa: B009
            client = getattr(algorithm, "client")  # noqa: B009
            state = {
                **composed(client["params"], server_params),
                **composed(client["buffers"], server_buffers),
            }
            return parts.model, state
        raise AttackError(f"{self.run_dir}: {self.config.algorithm.name} ends with no single model to attack")

    def trunk(self, t: int) -> tuple[nn.Module, Tensors]:
        """The split trunk and the client model broadcast in round ``t`` (what the server knows)."""
        parts = getattr(self.built.algorithm, "parts", None)
        if not isinstance(parts, SplitParts):
            raise AttackError(f"{self.run_dir}: {self.config.algorithm.name} is not split learning")
        held = self.record(t)
        prefix = "client_model/trunk."
        state = {k[len(prefix) :]: torch.from_numpy(v) for k, v in held.items() if k.startswith(prefix)}
        return parts.trunk, state
