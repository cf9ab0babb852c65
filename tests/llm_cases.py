"""Shared set-up of the language-model tests: small generated text files and tiny transformer configs."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest


def llm_extra() -> bool:
    """Whether the llm extra (transformers) is installed; found without importing it, which takes
    seconds, so that collecting the tests that only mark themselves with it stays fast."""
    return importlib.util.find_spec("transformers") is not None


needs_llm = pytest.mark.skipif(not llm_extra(), reason="needs the llm extra: pip install 'fedge[llm]'")
WORDS = ("the", "cut", "layer", "client", "server", "token", "adapter", "round", "model", "edge", "radio")


def write_corpus(folder: Path, files: int = 3, chars: int = 1400) -> Path:
    """``files`` documents of seeded word salad (one style per file; the last one JSONL)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        rng = np.random.default_rng(f)
        words = [WORDS[i] for i in rng.integers(0, len(WORDS) - f, size=chars // 4)]
        text = (" " if f % 2 else "_").join(words)[:chars]
        if f == files - 1:
            lines = [json.dumps({"text": text[i : i + 200]}) for i in range(0, len(text), 200)]
            (folder / f"doc{f}.jsonl").write_text("\n".join(lines) + "\n")
        else:
            (folder / f"doc{f}.txt").write_text(text)
    return folder


def lm_config(root: Path, algorithm: dict, *, arch: str = "gpt2", clients: int = 3, **overrides) -> dict:
    """A tiny run: 16-token sequences of the files in ``root``, one client per file, a 2 x 32 model."""
    options = {"layers": 2, "hidden": 32, "heads": 2, "lora_rank": 4}
    if arch != "gpt2":
        options.update(arch=arch, heads=4, kv_heads=2, intermediate=48)
    raw = {
        "seed": 3,
        "rounds": 2,
        "data": {"name": "text", "root": str(root), "seq_len": 16},
        "partition": {"kind": "natural" if clients > 1 else "iid", "num_clients": clients},
        "model": {"name": "gpt2" if arch == "gpt2" else "llama", "cut": 1, "options": options},
        "algorithm": {"batch_size": 8, "optimizer": {"lr": 0.05}, **algorithm},
        "eval": {"batch_size": 64},
        "output": {"plots": False},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def bert_run(root, algorithm: dict, *, clients: int = 3, **overrides) -> dict:
    """A tiny classification run: 16-byte windows of the files in ``root`` labeled by file, i.i.d. split."""
    raw = {
        "seed": 3,
        "rounds": 2,
        "data": {"name": "textcls", "root": str(root), "seq_len": 16},
        "partition": {"kind": "iid", "num_clients": clients},
        "model": {
            "name": "bert",
            "cut": 1,
            "options": {"layers": 2, "hidden": 32, "heads": 2, "lora_rank": 4},
        },
        "algorithm": {"batch_size": 8, "optimizer": {"lr": 0.05}, **algorithm},
        "eval": {"batch_size": 64},
        "output": {"plots": False},
    }
    for key, value in overrides.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def cli_run(raw: dict, path: Path):
    """``fedge run`` through the command line on config ``raw``, written to ``path``: the CLI's result."""
    from typer.testing import CliRunner

    from fedge.cli.commands import app

    path.write_text(json.dumps(raw))
    return CliRunner().invoke(app, ["run", str(path)])


def trained(raw: dict, rounds: int):
    """The built run of ``raw`` after ``rounds`` rounds (no run directory) and its rounds' metrics."""
    import fedge
    from fedge.runner.loop import build_run

    built = build_run(fedge.resolve_config(raw))
    return built, [built.algorithm.run_round(t) for t in range(1, rounds + 1)]


def executors_agree(config: Callable[[dict], dict], rounds: int = 3):
    """Both executors' runs of ``config(engine)`` after ``rounds`` rounds, checked to agree (identical
    ledgers, every round's training loss and the held-out loss within 1e-5) and to have trained (the loss
    moved); returns ``(built, metrics)`` of the sequential run, then of the batched one."""
    import pytest

    runs = [trained(config({"executor": ex}), rounds) for ex in ("sequential", "batched")]
    (seq, seq_metrics), (bat, bat_metrics) = runs
    assert seq.context.ledger.totals() == bat.context.ledger.totals()
    for m, n in zip(seq_metrics, bat_metrics, strict=True):
        assert m["train_loss"] == pytest.approx(n["train_loss"], abs=1e-5)
    assert seq.algorithm.evaluate()["loss"] == pytest.approx(bat.algorithm.evaluate()["loss"], abs=1e-5)
    assert seq_metrics[-1]["train_loss"] != seq_metrics[0]["train_loss"]  # it trained
    return runs
