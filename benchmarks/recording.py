"""What ``output.record`` costs a run, and what each attack of ``fedge attack`` costs, on this machine.

    python -m benchmarks.recording                 # examples/leakage-split.yaml, 3 repeats
    python -m benchmarks.recording --repeats 1 --rounds 2

One process runs the same config without recording and recording every round (smashed data, labels and
cut gradients, 256 samples a round), alternating, ``--repeats`` times each; the ratio of the median wall
seconds is the recording's overhead, beside the bytes a recorded round takes on disk. Then every attack
the recorded run allows runs once on it, with its seconds. Writes
``benchmarks/results/recording-cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import fedge
from fedge.attacks.from_run import attack

EXAMPLE = Path(__file__).parents[1] / "examples" / "leakage-split.yaml"
RESULTS = Path(__file__).parent / "results" / "recording-cpu.json"


def timed_run(out: Path, name: str, rounds: int, record: bool) -> tuple[float, Path]:
    """Wall seconds of one run and its directory."""
    keys = [f"rounds={rounds}", f"output.dir={out}", f"output.name={name}", "model.cut=1", "eval.every=100"]
    keys += ["output.record_every=1"] if record else ["output.record=[]"]
    config = fedge.resolve_config(EXAMPLE, keys)
    began = time.perf_counter()
    result = fedge.run(config)
    return time.perf_counter() - began, result.run_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        plain, kept, recorded = [], [], None
        for i in range(args.repeats):
            plain.append(timed_run(out, f"plain{i}", args.rounds, False)[0])
            seconds, recorded = timed_run(out, f"kept{i}", args.rounds, True)
            kept.append(seconds)
        assert recorded is not None
        manifest = json.loads((recorded / "records" / "manifest.json").read_text())
        attacks = {name: figures["seconds"] for name, figures in attack(recorded).items()}
    report = {
        "config": "examples/leakage-split.yaml, model.cut=1 (SplitFed v2, LeNet-5, Fashion-MNIST)",
        "rounds": args.rounds,
        "repeats": args.repeats,
        "wall_seconds_plain": statistics.median(plain),
        "wall_seconds_recording": statistics.median(kept),
        "overhead_ratio": statistics.median(kept) / statistics.median(plain),
        "bytes_per_recorded_round": manifest["bytes"] / len(manifest["rounds"]),
        "attack_seconds": attacks,
        "threads": 1,
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
