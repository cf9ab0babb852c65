"""The attacks as in-run evaluators (``eval.attacks``): on every recorded round, right after its record
is written, each named attack runs on that round against the live run and its headline figures join the
round's row as ``leak_<attack>_<figure>`` (so plots, sweeps and compare read them like accuracy).

They see exactly what ``fedge attack`` would see of that round, and change no number of the run: their
random draws come from their own seeded streams, torch's global generator is restored after them, and
they read the live model through functional calls only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedge.attacks.from_run import ATTACKS, NEEDS, Budget, headline
from fedge.attacks.run_view import RunView
from fedge.config import RunConfig
from fedge.errors import ConfigError
from fedge.runtime.recording import records_round

RECORD_KIND = {"cut/cut_gradients": "cut_gradients", "cut/smashed": "smashed", "updates/client": "updates"}


def check(config: RunConfig) -> None:
    """``eval.attacks`` names known attacks whose transfers the run records; a one-line refusal if not."""
    for name in config.eval.attacks:
        if name not in ATTACKS:
            raise ConfigError("eval.attacks", f"unknown attack {name!r}; known: {', '.join(ATTACKS)}")
        kind = RECORD_KIND.get(NEEDS.get(name, ""))
        if kind is not None and kind not in config.output.record:
            raise ConfigError("eval.attacks", f"{name} needs output.record: [{kind}]")


def figures(built: Any, run_dir: Path, t: int, budget: Budget | None = None) -> dict[str, float]:
    """Round ``t``'s in-run attack figures (none when ``t`` is not a recorded round)."""
    config: RunConfig = built.config
    if not config.eval.attacks or not records_round(config.output, t, config.rounds):
        return {}
    view = RunView(run_dir, [t])
    view.__dict__.update(config=config, built=built, final=built.algorithm)  # the live run, not a rebuilt one
    found: dict[str, float] = {}
    with torch.random.fork_rng():
        for name in config.eval.attacks:
            result = ATTACKS[name].run(view, budget or Budget(), config.seed)
            result.pop("_images", None)
            found.update({f"leak_{name}_{k}": v for k, v in headline(result).items()})
    return found
