"""What actually leaks on Fashion-MNIST: the attacks of ``fedge attack`` against split learning's cut layer
and its defences, 3 seeds, every figure read from the runs' ``summary.json`` and ``attacks.json``.

Every run is ``examples/leakage-split.yaml`` (LeNet-5, 5 iid clients, 12,000 training images, 5 rounds)
plus dotted overrides, recording its cut transfers (``output.record``) in its first and last rounds; the
attacks read the last one.

- ``cut``: SplitFed v2 and CSE-FSL (h = 2) cut after each of LeNet-5's blocks 1..4 (conv1, conv2, fc1,
  fc2): the decoder's reconstruction PSNR and SSIM (a curious server with the broadcast client model and
  2,000 test images as auxiliary data), label inference from the cut gradients for SplitFed v2 (CSE-FSL
  returns none), beside each cut's accuracy, MB and simulated seconds: the privacy-latency-communication
  trade-off of choosing the cut.
- ``cut_mnist``: the same on MNIST.
- ``labels``: SplitFed v2 at cut 2 with label DP (k-ary randomized response, epsilon 1, 2, 4, 8) and
  without: the direction attack's AUC and accuracy on the labels, and the accuracy each epsilon costs.
  Also the cut gradients clipped to 0.01 (their median norm is about 0.005) with Gaussian noise of
  multiplier 0.5 and 2 (``privacy.cut.gradient_*``; their releases give no finite epsilon on their own,
  the smashed data being sent in clear).
- ``codec``: SplitFed v2 at cut 1 with both links' codec fp32, q8, q4, q2 or top-10 %: does
  quantization or sparsification protect the smashed data and the cut gradients, and how much?
- ``light_fedsl``: lightweight FedSL's example on the digits (``examples/light-fedsl-digits.yaml``) with
  cut dropout 0, 0.3 and 0.6: does dropping activations at the cut protect them?
- ``noise``: SplitFed v2 at cut 1 with Gaussian noise on the smashed data calibrated to epsilon 1..256:
  the decoder's PSNR against epsilon, and accuracy.
- ``nopeek``: SplitFed v2 at cut 1 with NoPeek's distance-correlation weight 0 .. 10: PSNR and accuracy.

Writes ``docs/results/leakage.md`` and ``docs/results/leakage/<experiment>.csv``. Finished runs are read
back (``--fresh`` reruns them)::

    python examples/leakage_experiments.py                  # everything, seeds 1, 2, 3
    python examples/leakage_experiments.py --only cut       # one experiment
    python examples/leakage_experiments.py --quick --out /tmp/q   # a smoke version (1 seed, 1 round)
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fedge
from fedge.attacks.from_run import attack

EXAMPLES = Path(__file__).parent
RESULTS = EXAMPLES.parent / "docs" / "results"
CONFIG = EXAMPLES / "leakage-split.yaml"
FEDAVG = EXAMPLES / "leakage-fedavg.yaml"
LIGHT = EXAMPLES / "light-fedsl-digits.yaml"  # VGG-13 at width 0.25 cut after block 4, 300 rounds
DP_STAGES = (
    "aggregation.stages=[{name: clip, at: [server], options: {clip: 1.0}}, {name: gaussian, at: [server]}]"
)
SEEDS = (1, 2, 3)
ALGORITHMS = {"splitfed_v2": [], "cse_fsl": ["algorithm.h=2"]}
GRADIENTS = ["output.record=[smashed,labels,cut_gradients]"]
SMASHED = ["output.record=[smashed,labels]"]


@dataclass(frozen=True)
class Job:
    """One run: its experiment, variant (what differs), seed, overrides and the attacks it gets."""

    experiment: str
    variant: str
    seed: int
    overrides: tuple[str, ...]
    attacks: tuple[str, ...]
    config: Path = CONFIG

    @property
    def name(self) -> str:
        variant = self.variant.replace(" ", "-").replace(".", "_")
        return f"{self.experiment}-{variant}-s{self.seed}"


def cut_jobs(seeds: list[int]) -> Iterator[Job]:
    for algorithm, extra in ALGORITHMS.items():
        record, attacks = (
            (GRADIENTS, ("decoder", "label_direction"))
            if algorithm == "splitfed_v2"
            else (SMASHED, ("decoder",))
        )
        for cut in (1, 2, 3, 4):
            for seed in seeds:
                overrides = (f"algorithm.name={algorithm}", *extra, f"model.cut={cut}", *record)
                yield Job("cut", f"{algorithm} cut {cut}", seed, overrides, attacks)


def cut_mnist_jobs(seeds: list[int]) -> Iterator[Job]:
    for job in cut_jobs(seeds):
        yield Job("cut_mnist", job.variant, job.seed, (*job.overrides, "data.name=mnist"), job.attacks)


def label_jobs(seeds: list[int]) -> Iterator[Job]:
    for epsilon in (None, 1.0, 2.0, 4.0, 8.0):
        dp = [] if epsilon is None else [f"privacy.labels.epsilon={epsilon}"]
        for seed in seeds:
            overrides = ("model.cut=2", *GRADIENTS, *dp)
            yield Job("labels", f"label eps {epsilon or 'none'}", seed, overrides, ("label_direction",))
    yield from gradient_noise_jobs(seeds)


def gradient_noise_jobs(seeds: list[int]) -> Iterator[Job]:
    for multiplier in (0.5, 2.0):
        dp = [
            "privacy.cut.clip=1000.0",
            "privacy.cut.noise_multiplier=0.0",
            "privacy.cut.gradient_clip=0.01",
            f"privacy.cut.gradient_noise_multiplier={multiplier}",
        ]
        for seed in seeds:
            overrides = ("model.cut=2", *GRADIENTS, *dp)
            yield Job("labels", f"grad noise {multiplier}", seed, overrides, ("label_direction",))


def codec_jobs(seeds: list[int]) -> Iterator[Job]:
    for codec in ("fp32", "q8", "q4", "q2", "topk:0.1"):
        for seed in seeds:
            overrides = (
                "model.cut=1",
                *GRADIENTS,
                f"algorithm.codec_up={codec}",
                f"algorithm.codec_down={codec}",
            )
            yield Job(
                "codec", f"codec {codec}".replace(":", ""), seed, overrides, ("decoder", "label_direction")
            )


def light_fedsl_jobs(seeds: list[int]) -> Iterator[Job]:
    for dropout in (0.0, 0.3, 0.6):
        for seed in seeds:
            overrides = (*GRADIENTS, "output.record_every=1000", f"algorithm.cut_dropout={dropout}")
            yield Job("light_fedsl", f"cut dropout {dropout}", seed, overrides, ("decoder",), LIGHT)


def noise_jobs(seeds: list[int]) -> Iterator[Job]:
    for epsilon in (None, 1.0, 4.0, 16.0, 64.0, 256.0):
        dp = [] if epsilon is None else ["privacy.cut.clip=1.0", f"privacy.target_epsilon={epsilon}"]
        for seed in seeds:
            yield Job(
                "noise", f"cut eps {epsilon or 'none'}", seed, ("model.cut=1", *SMASHED, *dp), ("decoder",)
            )


def nopeek_jobs(seeds: list[int]) -> Iterator[Job]:
    for weight in (0.0, 0.5, 2.0, 5.0, 10.0):
        for seed in seeds:
            overrides = ("model.cut=1", *SMASHED, f"algorithm.nopeek={weight}")
            yield Job("nopeek", f"nopeek {weight}", seed, overrides, ("decoder",))


def membership_jobs(seeds: list[int]) -> Iterator[Job]:
    for epsilon in (None, 1.0, 4.0, 16.0):
        dp = [] if epsilon is None else [DP_STAGES, f"privacy.target_epsilon={epsilon}"]
        for seed in seeds:
            yield Job(
                "membership", f"dp-fedavg eps {epsilon or 'none'}", seed, tuple(dp), ("membership",), FEDAVG
            )


def gradient_jobs(seeds: list[int]) -> Iterator[Job]:
    for batch in (1, 4, 16):
        overrides = (
            "rounds=1",
            "data.train_limit=64",
            "partition.kind=iid",
            f"partition.num_clients={64 // batch}",
            "algorithm.fraction=1.0",
            "algorithm.local_epochs=1",
            f"algorithm.batch_size={batch}",
            "privacy.participation=fixed",
            "output.record=[updates]",
        )
        for seed in seeds:
            yield Job("gradients", f"batch {batch}", seed, overrides, ("gradient_inversion",), FEDAVG)


EXPERIMENTS = {
    "cut": cut_jobs,
    "cut_mnist": cut_mnist_jobs,
    "labels": label_jobs,
    "noise": noise_jobs,
    "codec": codec_jobs,
    "light_fedsl": light_fedsl_jobs,
    "nopeek": nopeek_jobs,
    "membership": membership_jobs,
    "gradients": gradient_jobs,
}


def execute(job: Job, out: Path, fresh: bool, quick: bool) -> dict[str, Any]:
    """Run ``job`` (unless finished before) and its attacks (unless made before); its row of figures."""
    run_dir = out / job.name
    summary_path = run_dir / "summary.json"
    attacks_path = run_dir / "attacks.json"
    if fresh or not summary_path.is_file():
        quick_keys = ["rounds=1", "data.train_limit=1000", "data.test_limit=500"] if quick else []
        keys = [
            *job.overrides,
            f"seed={job.seed}",
            f"output.dir={out}",
            f"output.name={job.name}",
            *quick_keys,
        ]
        if run_dir.exists():
            shutil.rmtree(run_dir)
        fedge.run(fedge.resolve_config(job.config, keys))
    if fresh or not attacks_path.is_file():
        attack(run_dir, list(job.attacks), seed=job.seed)
    summary = json.loads(summary_path.read_text())
    found = json.loads(attacks_path.read_text())
    row = {
        "experiment": job.experiment,
        "variant": job.variant,
        "seed": job.seed,
        "accuracy": summary.get("final_accuracy"),
        "mb": summary.get("mb_total"),
        "sim_seconds": summary.get("sim_seconds"),
        "epsilon": summary.get("epsilon"),
    }
    if "decoder" in found:
        row.update(
            psnr=found["decoder"]["psnr"],
            ssim=found["decoder"]["ssim"],
            mean_image_psnr=found["decoder"]["mean_image_psnr"],
            attack_seconds=found["decoder"]["seconds"],
        )
    if "membership" in found:
        row.update(
            mia_auc=found["membership"]["auc"],
            mia_tpr=found["membership"]["tpr_at_1pct_fpr"],
            attack_seconds=found["membership"]["seconds"],
        )
    if "gradient_inversion" in found:
        cases = found["gradient_inversion"]["cases"]
        row.update(
            psnr=found["gradient_inversion"]["psnr"],
            labels_right=statistics.fmean(case["labels_right"] for case in cases),
            attack_seconds=found["gradient_inversion"]["seconds"],
        )
    if "label_direction" in found:
        row.update(
            label_auc=found["label_direction"]["auc"], label_accuracy=found["label_direction"]["accuracy"]
        )
    return row


COLUMNS = [
    ("accuracy", "accuracy %", 100.0),
    ("mb", "MB", 1.0),
    ("sim_seconds", "sim s", 1.0),
    ("epsilon", "epsilon", 1.0),
    ("psnr", "PSNR dB", 1.0),
    ("ssim", "SSIM", 1.0),
    ("mean_image_psnr", "mean-image PSNR", 1.0),
    ("label_auc", "label AUC", 1.0),
    ("label_accuracy", "label acc", 1.0),
    ("mia_auc", "MIA AUC", 1.0),
    ("mia_tpr", "MIA TPR @1% FPR", 1.0),
    ("labels_right", "labels right", 1.0),
    ("attack_seconds", "attack s", 1.0),
]


def cell(values: list[float], scale: float) -> str:
    if not values:
        return ""
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.3g}"
    return f"{mean:.3g} ± {statistics.stdev(values) * scale:.2g}"


def table(rows: list[dict[str, Any]]) -> str:
    """Mean ± std over seeds per variant, for every column some row has."""
    shown = [c for c in COLUMNS if any(row.get(c[0]) is not None for row in rows)]
    lines = [
        "| variant | " + " | ".join(title for _, title, _ in shown) + " |",
        "|---" * (len(shown) + 1) + "|",
    ]
    for variant in dict.fromkeys(row["variant"] for row in rows):
        mine = [row for row in rows if row["variant"] == variant]
        cells = [cell([r[key] for r in mine if r.get(key) is not None], scale) for key, _, scale in shown]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(experiment: str, rows: list[dict[str, Any]], where: Path, command: str) -> None:
    """The experiment's csv and its section of ``leakage.md`` (other experiments' sections kept)."""
    folder = where / "leakage"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{experiment}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for row in rows for k in row}))
        writer.writeheader()
        writer.writerows(rows)
    page = where / "leakage.md"
    sections = {}
    if page.is_file():
        for part in page.read_text().split("\n## ")[1:]:
            title, _, body = part.partition("\n")
            sections[title.strip()] = body.strip()
    sections[experiment] = f"`{command}`, seeds {sorted({row['seed'] for row in rows})}\n\n{table(rows)}"
    text = "# Leakage experiments (written by examples/leakage_experiments.py)\n"
    ordered = [name for name in EXPERIMENTS if name in sections] + [
        n for n in sections if n not in EXPERIMENTS
    ]
    text += "".join(f"\n## {name}\n\n{sections[name]}\n" for name in ordered)
    page.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=list(EXPERIMENTS), action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--out", type=Path, default=Path("runs/leakage"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 round, small data: a smoke test")
    args = parser.parse_args(argv)
    seeds = args.seeds[:1] if args.quick else args.seeds
    for experiment in args.only or list(EXPERIMENTS):
        rows = [execute(job, args.out, args.fresh, args.quick) for job in EXPERIMENTS[experiment](seeds)]
        command = f"python examples/leakage_experiments.py --only {experiment}"
        write(experiment, rows, args.results, command)
        print(f"{experiment}: {len(rows)} runs")


if __name__ == "__main__":
    main()
