"""Sequential and batched executors train the same model on every example config.

For each ``examples/*.yaml`` the script builds the run twice (``engine.executor=sequential`` and
``=batched``), runs the first rounds of both through :meth:`fedge.runner.loop.Built.round` and reports the
largest difference between every floating tensor of the two algorithms' state and between their
evaluations. Dropout models are included: random layers draw keyed noise, so both executors use the same
masks. Datasets that are not on this machine (CIFAR-10, F-EMNIST) are replaced by synthetic data of the
same shape and number of classes, and large runs are cut to fewer clients' data, so the check runs on a
laptop; the algorithm, model and every other setting stay the example's.

    python scripts/executors_agree.py               # every example, 2 rounds
    python scripts/executors_agree.py --rounds 3 --only hist-fmnist quickstart
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
# data substitutes for what this machine lacks, and caps that keep each check to seconds
SUBSTITUTES: dict[str, tuple[str, ...]] = {
    "cifar10": ("data.name=synthetic", "data.shape=[3,32,32]", "data.num_train=1500", "data.num_test=200"),
    "femnist": (
        "data.name=synthetic",
        "data.shape=[1,28,28]",
        "data.num_classes=62",
        "data.num_train=1200",
        "data.num_test=200",
        "partition.kind=iid",
        "partition.num_clients=20",
    ),
}
CAPS = ("data.train_limit=3000", "data.test_limit=500")


def overrides(raw: dict[str, Any], rounds: int) -> list[str]:
    """The settings of the check: the example's, on data this machine has, for ``rounds`` rounds."""
    data = raw.get("data", {}).get("name", "digits")
    keys = [f"rounds={rounds}", "eval.every=1", "output.plots=false"]
    if data in SUBSTITUTES:
        return [*keys, *SUBSTITUTES[data]]
    return [*keys, *CAPS] if data in ("mnist", "fashion-mnist") else keys


def floating_leaves(value: Any, path: str = "") -> dict[str, torch.Tensor]:
    """Every floating tensor inside a (nested) state, by its path."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach().double().cpu()} if value.is_floating_point() else {}
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in floating_leaves(item, f"{path}.{key}").items()
        }
    if isinstance(value, list | tuple):
        return {
            k: v for i, item in enumerate(value) for k, v in floating_leaves(item, f"{path}[{i}]").items()
        }
    return {}


def run(raw: dict[str, Any], keys: list[str], executor: str) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The final state and the evaluation rows of the example on ``executor``."""
    from fedge.api import resolve_config
    from fedge.runner.loop import build_run

    config = resolve_config(raw, [*keys, f"engine.executor={executor}"])
    built = build_run(config)
    rows = []
    for t in range(1, config.rounds + 1):
        built.round(t)
        rows.append(built.evaluate(t).row())
    return floating_leaves(built.algorithm.state_dict()), rows


def compare(example: Path, rounds: int) -> tuple[float, float]:
    """Largest |difference| of the final state and of the evaluations' loss between the executors."""
    from fedge.config import load_raw

    raw = load_raw(example)
    keys = overrides(raw, rounds)
    seq_state, seq_rows = run(raw, keys, "sequential")
    bat_state, bat_rows = run(raw, keys, "batched")
    if seq_state.keys() != bat_state.keys():
        raise SystemExit(f"{example.name}: the executors hold different state")
    state = max((float((seq_state[k] - bat_state[k]).abs().max()) for k in seq_state), default=0.0)
    loss = max(abs(a["loss"] - b["loss"]) for a, b in zip(seq_rows, bat_rows, strict=True))
    return state, loss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="example names without .yaml (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    if args.only:
        examples = [e for e in examples if e.stem in args.only]
    print(f"{'example':32} {'max |state diff|':>17} {'max |loss diff|':>16}  {'s':>6}")
    worst = 0.0
    for example in examples:
        began = time.perf_counter()
        state, loss = compare(example, args.rounds)
        worst = max(worst, state)
        mark = "ok" if state <= TOLERANCE else "DIFFERS"
        seconds = time.perf_counter() - began
        print(f"{example.stem:32} {state:17.2e} {loss:16.2e}  {seconds:6.1f}  {mark}", flush=True)
    print(f"largest state difference {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
