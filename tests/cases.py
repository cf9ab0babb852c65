"""Shared by the robustness tests: tiny configs of every algorithm, the config schema's leaves, a CLI call
and the check that its outcome is one the issue allows (one-line exit 2 and no directory, a finished run,
or a divergence stopped with exit 3); for the aggregation tests, a small run with given stages and its
final model; and, for the split privacy tests, a split run's config, its first rounds and a resume."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel
from typer.testing import CliRunner

import fedge
from fedge.aggregation.pipeline import Pipeline
from fedge.algorithms import ALGORITHMS
from fedge.cli.commands import app
from fedge.config import AlgorithmConfig, RunConfig, StrictModel
from fedge.runner import checkpoint

ALGORITHM_NAMES = sorted(ALGORITHMS)
SPLIT = ("splitfed_v1", "splitfed_v2", "fsl_an", "cse_fsl", "light_fedsl", "fedsl", "fsl_sage")
SPLIT += ("cse_fsl_async",)
HIERARCHICAL = ("hist", "hfedavg")


def tiny(algorithm: str, out: Path, rounds: int = 2) -> dict[str, Any]:
    """A run of ``algorithm`` on a small synthetic set that takes well under a second."""
    config: dict[str, Any] = {
        "seed": 3,
        "rounds": rounds,
        "data": {
            "name": "synthetic",
            "num_train": 240,
            "num_test": 120,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "iid", "num_clients": 4},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "algorithm": {"name": algorithm},
        "output": {"dir": str(out), "plots": False},
    }
    if algorithm in SPLIT:
        config["model"]["cut"] = 1
    if algorithm in HIERARCHICAL:
        config["algorithm"].update(split="partition", edge_rounds=1, local_steps=2, batch_size=8)
    return config


def _block(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _block(arg)
        if found is not None:
            return found
    return None


def leaves(algorithm: str, block: type[BaseModel] = RunConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """Every settable key of ``algorithm``'s config schema, dotted, with its annotation."""
    found = []
    for name, field in block.model_fields.items():
        key = f"{prefix}{name}"
        inner = AlgorithmConfig.registry[algorithm] if block is RunConfig and name == "algorithm" else None
        inner = inner or _block(field.annotation)
        if inner is not None:
            found += leaves(algorithm, inner, f"{key}.")
        elif key not in ("algorithm.name", "output.dir"):
            found.append((key, field.annotation))
    return found


def set_key(config: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` of ``config`` to ``value``, creating (or replacing non-block) parents."""
    *path, last = key.split(".")
    node = config
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


@dataclass
class Outcome:
    code: int
    lines: list[str]
    output: str
    exception: BaseException | None


def invoke(args: list[str]) -> Outcome:
    """``fedge <args>`` in this process."""
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    unexpected = None if isinstance(result.exception, SystemExit) else result.exception
    return Outcome(result.exit_code, lines, result.output, unexpected)


def strict_json(path: Path) -> Any:
    """``path`` parsed as strict JSON (no NaN or Infinity)."""

    def refuse(token: str) -> None:
        raise ValueError(f"{path}: {token} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def finite_numbers(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return True


def run_dirs(out: Path) -> list[Path]:
    return sorted(out.iterdir()) if out.is_dir() else []


def check_outcome(outcome: Outcome, out: Path, context: str = "") -> str:
    """Assert the issue's contract; return the outcome: ``refused``, ``finished`` or ``diverged``."""
    where = f"{context}\n{outcome.output}"
    assert outcome.exception is None, f"traceback ({outcome.exception!r}): {where}"
    assert "Traceback" not in outcome.output, where
    if outcome.code == 2:
        assert len(outcome.lines) == 1 and outcome.lines[0].startswith("error: "), where
        assert "Value error," not in outcome.lines[0], where
        assert run_dirs(out) == [], f"directory left behind: {where}"
        return "refused"
    assert outcome.code in (0, 3), f"exit code {outcome.code}: {where}"
    (run_dir,) = run_dirs(out)
    summary = strict_json(run_dir / "summary.json")
    if outcome.code == 3:
        assert len(outcome.lines) == 1 and "diverged in round" in outcome.lines[0], where
        assert summary["status"] == "diverged" and summary["reason"], where
        return "diverged"
    assert summary["status"] == "finished" and finite_numbers(summary), where
    return "finished"


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make the folder ``path`` unwritable, even for root (``chattr +i``); skip the test if impossible."""
    os.chmod(path, 0o555)
    immutable = False
    try:
        probe = path / ".probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            immutable = (
                subprocess.run(["chattr", "+i", str(path)], capture_output=True, timeout=60).returncode == 0
            )
            if not immutable:
                pytest.skip("cannot make a folder read-only here")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True, timeout=60)
        os.chmod(path, 0o755)


def small_hist(tmp_path: Path, rounds: int, **algorithm: Any) -> dict[str, Any]:
    """HIST on a small synthetic set: 8 clients in 2 cells, 2 edge rounds of 3 steps."""
    return {  # fmt: skip
        "seed": 5,
        "rounds": rounds,
        "data": {
            "name": "synthetic",
            "num_train": 480,
            "num_test": 120,
            "shape": [1, 6, 6],
            "num_classes": 4,
        },
        "partition": {"kind": "iid", "num_clients": 8},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "algorithm": {
            "name": "hist",
            "cells": 2,
            "edge_rounds": 2,
            "local_steps": 3,
            "batch_size": 16,
            **algorithm,
        },
        "output": {"dir": str(tmp_path / "runs"), "plots": False},
    }


def staged(tmp_path: Path, algorithm: dict, stages: list, executor: str = "sequential") -> dict[str, Any]:
    """A two-round run of ``algorithm`` on small synthetic data with ``aggregation.stages`` set."""
    return {
        "seed": 3,
        "rounds": 2,
        "data": {"name": "synthetic", "num_train": 240, "num_test": 80, "shape": [1, 6, 6], "num_classes": 4},
        "partition": {"kind": "iid", "num_clients": 6},
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "algorithm": algorithm,
        "aggregation": {"stages": stages},
        "engine": {"executor": executor, "threads": 1},
        "output": {"dir": str(tmp_path / executor), "plots": False},
    }


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    """The final model (the shared one, or every client's stacked) from a run's checkpoint."""
    state = checkpoint.load(run_dir / "checkpoint.pt").state["algorithm"]
    return state["bank"]["params"] if "bank" in state else state["params"]


def killed_after(config: dict[str, Any], round_: int) -> None:
    """Run ``config`` and stop it after round ``round_`` as a kill would (its checkpoint and metrics
    left as they were then)."""

    def stop(t: int, row: dict[str, Any]) -> None:
        if t == round_:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fedge.run(config, on_round=stop)


_REDUCE = Pipeline.reduce


def reduced(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], site: str | None = None
) -> tuple[list, Any]:
    """Run ``config`` recording the updates every aggregation pipeline (only ``site``'s, where given)
    received, in order; the updates and the run's result."""
    seen: list = []
    reduce = _REDUCE  # the class's own, not a recording an earlier call of this test put in its place

    def recording(self, updates, cohort=None):
        if site is None or updates.site == site:
            seen.append(updates)
        return reduce(self, updates, cohort)

    monkeypatch.setattr(Pipeline, "reduce", recording)
    return seen, fedge.run(config)


def split_case(out: Path, algorithm: str, privacy: dict[str, Any] | None = None, **options: Any) -> dict:
    """:func:`tiny` for a split algorithm in batches of 16 with ``options`` and a ``privacy`` block, as
    the split privacy tests run it."""
    config = tiny(algorithm, out)
    config["algorithm"].update({"batch_size": 16, **options})
    if privacy is not None:
        config["privacy"] = privacy
    return config


def trained_rounds(raw: dict[str, Any], rounds: int = 2, executor: str = "sequential"):
    """The built run of ``raw`` on ``executor`` after ``rounds`` rounds, and those rounds' reports."""
    from fedge.runner.loop import build_run

    built = build_run(fedge.resolve_config({**raw, "engine": {"executor": executor}}))
    metrics = [built.algorithm.run_round(t) for t in range(1, rounds + 1)]
    return built, metrics


def whole_and_resumed(config_of: Callable[[Path], dict[str, Any]], out: Path, rounds: int, after: int):
    """The run ``config_of(out)`` of ``rounds`` rounds, and the same run killed after round ``after`` and
    resumed (its results)."""
    whole = fedge.run({**config_of(out), "rounds": rounds})
    config = {**config_of(out / "cut"), "rounds": rounds}
    config["output"]["name"] = "cut"
    killed_after(config, after)
    return whole, fedge.resume(out / "cut" / "cut")


def sign_flipped_digits(out: Path, stages: list[Any], attacked: bool, rounds: int = 5) -> float:
    """The final accuracy of FedAvg on digits (8 iid clients, an MLP of 32, ``lr`` 0.1, seed 1) through
    the server's ``stages``; ``attacked``: 2 of the 8 clients flip their change at scale 4."""
    config: dict[str, Any] = {
        "seed": 1,
        "rounds": rounds,
        "data": {"name": "digits"},
        "partition": {"kind": "iid", "num_clients": 8},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "algorithm": {"name": "fedavg", "optimizer": {"lr": 0.1}},
        "aggregation": {"stages": stages},
        "output": {"dir": str(out), "plots": False},
    }
    if attacked:
        config["adversary"] = {"clients": 0.25, "attack": "sign_flip", "options": {"scale": 4.0}}
    return fedge.run(config).summary["final_accuracy"]


EXAMPLES = Path(__file__).parents[1] / "examples"


def example_script(name: str) -> Any:
    """The example script ``examples/<name>.py`` imported as a module (registered under its name: a
    dataclass in it looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
