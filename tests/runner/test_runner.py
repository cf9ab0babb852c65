"""End-to-end runs: determinism, exact ledger totals, results directory, kill-and-resume."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import children
import pytest
import yaml
from cases import invoke, tiny
from llm_cases import lm_config, write_corpus

import fedge
from fedge.files import results
from fedge.models import build_model, count_parameters
from fedge.runner import checkpoint

WALL = ("wall_seconds",)


def strip_wall(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in WALL} for row in rows]


def test_results_directory_is_complete(tiny_config):
    tiny_config["output"]["plots"] = True
    result = fedge.run(tiny_config)
    names = {p.name for p in result.run_dir.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "checkpoint.pt", "ledger.csv", "plots"} <= names
    assert {p.name for p in (result.run_dir / "plots").iterdir()} == {
        "accuracy_vs_round.png",
        "accuracy_vs_mb.png",
        "accuracy_vs_time.png",
    }
    assert not [n for n in names if n.startswith(".")]
    rows = results.read_jsonl(result.run_dir / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == rows[-1]["accuracy"]
    assert fedge.load_config(result.run_dir / "config.yaml") == fedge.resolve_config(tiny_config)


def test_same_seed_same_metrics_and_new_directory(tiny_config):
    first = fedge.run(tiny_config)
    second = fedge.run(tiny_config)
    assert second.run_dir != first.run_dir and second.run_dir.name == first.run_dir.name + "-2"
    assert strip_wall(first.metrics) == strip_wall(second.metrics)
    other = fedge.run(tiny_config, ["seed=4"])
    assert strip_wall(other.metrics) != strip_wall(first.metrics)


def test_executors_agree_end_to_end(tiny_config):
    """Unequal client sizes (Dirichlet), momentum and weight decay: final FedAvg parameters within 1e-5."""
    tiny_config["algorithm"]["optimizer"].update(momentum=0.9, weight_decay=1e-3)
    batched = fedge.run(tiny_config, ["engine.executor=batched"])
    sequential = fedge.run(tiny_config, ["engine.executor=sequential"])
    final = [
        checkpoint.load(r.run_dir / "checkpoint.pt").state["algorithm"]["params"]
        for r in (batched, sequential)
    ]
    assert max(float((final[0][k] - final[1][k]).abs().max()) for k in final[0]) < 1e-5
    for a, b in zip(batched.metrics, sequential.metrics, strict=True):
        assert abs(a["accuracy"] - b["accuracy"]) < 1e-9 and abs(a["loss"] - b["loss"]) < 1e-4


@pytest.mark.ci
def test_quickstart_reaches_90_percent(tmp_path):
    """FedAvg on digits, 10 clients, Dirichlet(0.5), default rounds: the issue's accuracy bar."""
    result = fedge.run(None, [f"output.dir={tmp_path}", "output.plots=false"])
    cfg = result.config
    assert (cfg.data.name, cfg.partition.kind, cfg.partition.alpha, cfg.partition.num_clients) == (
        "digits",
        "dirichlet",
        0.5,
        10,
    )
    assert result.summary["final_accuracy"] >= 0.90


def test_fedavg_ledger_equals_formula(tiny_config):
    rounds, clients = 5, 6
    result = fedge.run(
        tiny_config, [f"rounds={rounds}", f"partition.num_clients={clients}", "algorithm.fraction=0.5"]
    )
    model = build_model("mlp", (1, 6, 6), 4, hidden=[16])
    participants = round(0.5 * clients)
    expected = 2 * rounds * participants * count_parameters(model) * 32
    summary = result.summary
    assert summary["bits_up"] + summary["bits_down"] == expected
    assert summary["bits_up"] == summary["bits_down"]
    ledger = (result.run_dir / "ledger.csv").read_text().splitlines()
    assert len(ledger) == 1 + 2 * rounds * participants


def test_centralized_reference_runs(tiny_config):
    tiny_config["algorithm"] = {"name": "centralized", "batch_size": 16, "optimizer": {"lr": 0.1}}
    result = fedge.run(tiny_config)
    assert result.summary["bits_up"] == 0 and result.summary["final_accuracy"] > 0.5


@pytest.mark.ci
def test_killed_run_resumes_to_identical_metrics(tiny_config, tmp_path):
    tiny_config.update(rounds=120)
    tiny_config["output"].update(checkpoint_every=2, name="killed")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config))
    env = {**os.environ, "PYTHONPATH": str(Path(fedge.__file__).parents[1])}
    with children.started([sys.executable, "-m", "fedge", "run", str(path), "-q"], env=env) as proc:
        run_dir = tmp_path / "runs" / "killed"
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 5:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=children.REAP)
    assert not (run_dir / "summary.json").exists(), "the run finished before it could be killed"
    resumed = fedge.resume(run_dir)
    tiny_config["output"]["name"] = "uninterrupted"
    reference = fedge.run(tiny_config)
    assert len(resumed.metrics) == 120
    assert strip_wall(resumed.metrics) == strip_wall(reference.metrics)
    assert strip_wall(results.read_jsonl(metrics)) == strip_wall(reference.metrics)


# --- a resume reads the inputs the run started with, or refuses -----------------------------------------


def _cut_after_round_2(raw: dict) -> Path:
    """Run ``raw`` until its round-2 checkpoint, then stop it as a kill would (its run directory)."""

    def stop(t, row):
        if t == 2:
            raise KeyboardInterrupt

    with contextlib.suppress(KeyboardInterrupt):
        fedge.run(raw, on_round=stop)
    (run_dir,) = Path(raw["output"]["dir"]).iterdir()
    return run_dir


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _refused_naming(run_dir: Path, key: str, changed: Path) -> None:
    before = _files(run_dir)
    outcome = invoke(["resume", str(run_dir), "-q"])
    assert outcome.exception is None and outcome.code == 2, outcome.output
    assert len(outcome.lines) == 1, outcome.output
    assert outcome.lines[0].startswith(f"error: {key}: {changed.resolve()} changed since the run started")
    assert _files(run_dir) == before


def test_a_resume_refuses_a_device_profile_file_that_changed_and_continues_with_the_original(tmp_path):
    profile = tmp_path / "devices.csv"
    profile.write_text("client,cpu_hz\n0,1e7\n1,2e9\n2,3e9\n3,4e9\n")
    raw = tiny("fedbuff", tmp_path / "runs", rounds=4)
    raw["system"] = {"devices": {"file": str(profile)}}
    run_dir = _cut_after_round_2(raw)
    original = profile.read_text()
    profile.write_text(original.replace("0,1e7", "0,9e9"))
    _refused_naming(run_dir, "system.devices.file", profile)
    profile.write_text(original)
    resumed = fedge.resume(run_dir)
    reference = fedge.run(raw | {"output": {**raw["output"], "dir": str(tmp_path / "reference")}})
    assert strip_wall(resumed.metrics) == strip_wall(reference.metrics)


def test_a_resume_refuses_a_text_file_that_grew(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    raw = lm_config(corpus, {"name": "fedavg"}, rounds=4)
    raw["model"].pop("cut")
    raw["output"]["dir"] = str(tmp_path / "runs")
    run_dir = _cut_after_round_2(raw)
    grown = corpus / "doc0.txt"
    grown.write_text(grown.read_text() + " token" * 200)
    _refused_naming(run_dir, "data.root", grown)


def test_the_summary_names_a_best_round_only_when_it_beats_the_final_one(tmp_path, monkeypatch):
    from rich.console import Console

    from fedge.cli import commands as cli

    result = fedge.run(
        fedge.resolve_config(None, ["rounds=2", f"output.dir={tmp_path}", "output.plots=false"])
    )
    printed = []
    for best in (result.summary["final_accuracy"], 1.0 + result.summary["final_accuracy"]):
        monkeypatch.setattr(cli, "console", Console(record=True, width=200))
        summary = result.summary | {"best_accuracy": best, "best_round": 1}
        cli._print_summary(fedge.runner.loop.Result(result.run_dir, result.config, result.metrics, summary))
        printed.append(cli.console.export_text())
    tied, higher = printed
    assert "= final" in tied and "(round 1)" not in tied
    assert "% (round 1)" in higher and "= final" not in higher
