"""Golden outputs: prove that a refactor changes no number.

``record`` runs a fixed set of configurations and stores, per case, every metrics row (all fields but
wall-clock time), the summary and a hash of the ledger CSV; ``check`` runs them again and reports every
field that differs. Two suites:

- ``examples``: the quickstart and one example per family (``fedavg``, ``splitfed_v1``, ``cse_fsl``,
  ``light_fedsl``, ``afind``, ``hist``), at their example settings (rounds shortened where noted);
- ``algorithms``: every registered algorithm on a few rounds of digits, on both executors.

Numbers are compared exactly (``--tolerance`` relaxes that). A change of numbers that is intended is
listed in ``CHANGED_BY_DESIGN`` with its reason (the case, or only some of its fields, is then reported
and not failed); a change of rounding only is listed in ``ROUNDED_BY_DESIGN``, whose cases are compared
within its relative tolerance instead of exactly (every field still checked). The recorded numbers stay
those of the code before the change.

    python scripts/golden.py record --suite examples
    python scripts/golden.py check --suite all

The committed recordings come from one machine; another processor may round differently. Before a
refactor on another machine, record a baseline of the code as it is into a folder of your own and compare
against it after: ``--baseline DIR`` reads and writes the recordings there and compares exactly, without
the by-design lists (they describe changes since the committed recording); ``--ignore FIELD ...`` leaves
fields out of that comparison, for an intended change.

    python scripts/golden.py record --baseline /tmp/golden-before
    python scripts/golden.py check --baseline /tmp/golden-before
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "scripts" / "golden"
WALL_CLOCK = {"wall_seconds"}
KEYED_DROPOUT = (
    "dropout now draws keyed noise: both executors use the same masks, unlike the global generator"
)
NEW_CLOCK = "newly modelled: peer links and HIST clients now have simulated latency and energy"
SERVER_POWER = (
    "the server's compute energy is its stated power draw (system.server_compute_w = 100 W) times its "
    "compute time instead of the clients' kappa f^2 at 1e11 Hz (100 kW): plausible joules"
)
ENERGY_FIELDS = frozenset({"sim_joules", "sim_joules_by_phase", "sim_joules_by_tier", "sim_joules_top_nodes"})
SERVER_EFFICIENCY = (
    "the server's compute is charged 2 W for its 1e11 FLOP/s (system.server_compute_w: 50 GFLOP/J, a "
    "data-centre GPU) instead of 100 W (1 GFLOP/J, ten times a client's joules per FLOP): energy only"
)
# intended changes since the recording: (case name patterns, changed fields or None for all, why)
CHANGED_BY_DESIGN: list[tuple[tuple[str, ...], frozenset[str] | None, str]] = [
    (
        ("hist-fmnist", "hist-aircomp", "hist-sequential", "hist-batched", "hist-aircomp-optimised-*"),
        None,
        KEYED_DROPOUT,
    ),
    (("fsl_an-sequential", "fsl_an-batched"), None, KEYED_DROPOUT),
    (
        ("dispfl*",),
        frozenset({"bits_by_kind", "bits_peer", "mb_total", "ledger"}),
        "Dis-PFL's models are counted by the bitmap codec: dense layers no longer pay for a bitmap",
    ),
    (("hist*", "hfedavg*"), frozenset({"sim_joules"}), NEW_CLOCK),
    (
        (
            "splitfed_v1*", "splitfed_v2*", "fsl_an*", "cse_fsl*", "light_fedsl*", "fedsl*",
            "centralized*",
        ),
        frozenset({"sim_joules"}),
        SERVER_POWER,
    ),
    (
        ("afind*", "gossip*", "pens*", "federico*", "local*", "ditto*", "dispfl*"),
        frozenset({"sim_seconds", "sim_joules"}),
        NEW_CLOCK,
    ),
    (
        ("light_fedsl*",),
        None,
        "lightweight FedSL's masks are the aggregated model's non-zero pattern instead of all ones, so "
        "pruned weights stay pruned after an aggregation",
    ),
    (
        (
            "splitfed_v1-mnist",
            "cse_fsl-mnist",
            "cse_fsl-batched",
            "cse_fsl-theory-batched",
            "cse_fsl-post-step-batched",
            "splitfed_v1-batched",
            "splitfed_v1-replacement-batched",
            "splitfed_v2-batched",
            "splitfed_v2-client_after_client-batched",
            "fsl_an-local-aux-batched",
            "fsl_an-no-dropout-batched",
            "hfedavg-lenet-cell_iid-batched",
        ),
        None,
        "the batched executor convolves each client on its own (the sequential executor's kernel calls) "
        "instead of one grouped convolution: rounding of convolutional models on the batched executor",
    ),
    (
        ("afind-fashion-mnist", "afind-sequential", "afind-batched", "ditto-afind-*", "dispfl-afind-*"),
        frozenset({"theta_mean"}),
        "AFIND+'s cosines of a linear proxy come from the layer's inputs and output gradients instead of "
        "the formed gradient: rounding of the similarities (the threshold's mean), same selections",
    ),
    (
        (
            "hist-fmnist", "hist-aircomp", "hist-sequential", "hist-batched", "hfedavg-sequential",
            "hfedavg-batched", "hist-aircomp-optimised-*", "hist-no-dropout-*",
        ),
        None,
        "HIST's fully non-i.i.d. split is the paper's (cells own disjoint classes) instead of label shards "
        "dealt over all clients (now split: global_shards)",
    ),
    (
        ("fsl_sage*",),
        frozenset({
            "sim_seconds", "sim_joules", "sim_seconds_by_phase", "sim_joules_by_phase", "sim_joules_by_tier",
            "sim_joules_top_nodes",
        }),  # fmt: skip
        "FSL-SAGE's alignment is on the simulated clock: the server's fitting of the aux models (phase "
        "align) and the aligned aux models' downloads after it, in alignment rounds",
    ),
    (
        (
            "splitfed_v1*", "splitfed_v2*", "fsl_an*", "cse_fsl*", "light_fedsl*", "fedsl*",
            "centralized*", "fsl_sage*",
        ),
        ENERGY_FIELDS,
        SERVER_EFFICIENCY,
    ),  # fmt: skip
    (
        ("fedbuff*",),
        None,
        "FedBuff weights each buffered update 1/K, the paper's (weighting: uniform), instead of by samples",
    ),
    (
        ("fedasync*",),
        None,
        "FedAsync's clients train on the paper's regularised objective (proximal_mu = 0.005)",
    ),
]

# intended rounding changes: (case name patterns, relative tolerance, why)
ROUNDED_BY_DESIGN: list[tuple[tuple[str, ...], float, str]] = [
    (
        (
            "quickstart",
            "fedavg-mnist",
            "afind-fashion-mnist",
            *(
                f"{name}-batched"
                for name in (
                    "fedavg",
                    "fedavg_ft",
                    "fedavg-fp16",
                    "fedfomo",
                    "afind",
                    "afind-standard-head",
                    "afind-dp-alternating",
                    "ditto",
                    "ditto-afind",
                    "federico",
                    "gossip",
                    "local",
                    "pens",
                    "hfedavg",
                    "hist-no-dropout",
                )
            ),
        ),
        2e-4,
        "the batched executor trains dense networks with the fused kernel (the update folded into the "
        "weight-gradient product): one rounding less per weight and step than vmapped autograd (losses "
        "move by about 1e-7; fedavg-mnist's round 8 classifies one of 10,000 test images differently)",
    ),
    (
        ("cse_fsl-sequential", "cse_fsl-theory-sequential", "cse_fsl-post-step-sequential"),
        1e-5,
        "CSE-FSL's shared server steps its dense part by the fused kernel instead of autograd: rounding",
    ),
    (
        (
            "splitfed_v1-sequential",
            "splitfed_v1-replacement-sequential",
            "fsl_an-local-aux-sequential",
            "fsl_an-no-dropout-sequential",
        ),
        1e-5,
        "SplitFed v1's and FSL_AN's server copies step their dense part together by the fused kernel "
        "instead of the executor's map: rounding",
    ),
]


@dataclass(frozen=True)
class Case:
    """One run: a config file (None: the quickstart) and dotted overrides."""

    name: str
    config: str | None
    overrides: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()  # algorithm keys of the file that the overriding algorithm does not know


EXAMPLES = [
    Case("quickstart", None),
    Case("fedavg-mnist", "examples/fedavg-mnist.yaml"),
    Case("splitfed_v1-mnist", "examples/split-mnist.yaml", ("algorithm.name=splitfed_v1",), drop=("h",)),
    Case("cse_fsl-mnist", "examples/split-mnist.yaml"),
    Case("light_fedsl-digits", "examples/light-fedsl-digits.yaml"),
    Case("afind-fashion-mnist", "examples/afind-fashion-mnist.yaml"),
    Case("hist-fmnist", "examples/hist-fmnist.yaml"),
    Case("hist-aircomp", "examples/hist-aircomp.yaml", ("rounds=10",)),
]

SMALL = (
    "rounds=3",
    "data.name=digits",
    "partition.kind=dirichlet",
    "partition.alpha=0.5",
    "partition.num_clients=6",
    "eval.every=1",
)
LENET = (
    "data.name=synthetic",
    "data.shape=[1,28,28]",
    "data.num_train=600",
    "data.num_test=200",
    "model.name=lenet5",
    "model.cut=2",
)
HIST = (
    "model.name=fcnn",
    "algorithm.cells=2",
    "algorithm.edge_rounds=2",
    "algorithm.local_steps=3",
    "partition.num_clients=8",
)
# per algorithm: the data, model and algorithm keys that make a small but complete run
ALGORITHM_SETTINGS: dict[str, tuple[str, ...]] = {
    "fedavg": ("algorithm.fraction=0.5",),
    "centralized": (),
    "splitfed_v1": (*LENET, "algorithm.local_epochs=1"),
    "splitfed_v2": (*LENET, "algorithm.clip_norm=1.0"),
    "fsl_an": (*LENET, "model.options.dropout=0.3"),
    "cse_fsl": (*LENET, "algorithm.h=2", "algorithm.server_order=random"),
    "fsl_sage": (*LENET, "algorithm.h=2", "algorithm.align_every=2", "algorithm.align_epochs=5"),
    "light_fedsl": (
        "model.name=vgg",
        "model.cut=4",
        "model.options.depth=11",
        "model.options.width=0.25",
        "algorithm.drop_last=true",
        "rounds=6",
        "algorithm.agg_interval=3",
    ),
    "fedsl": ("model.name=mlp", "model.cut=1", "rounds=4"),
    "local": ("algorithm.local_epochs=1",),
    "fedavg_ft": ("algorithm.local_epochs=1",),
    "gossip": ("algorithm.local_epochs=1", "algorithm.peers=2"),
    "pens": ("algorithm.local_epochs=1", "algorithm.peers=2"),
    "federico": ("algorithm.local_epochs=1", "algorithm.peers=2"),
    "afind": ("algorithm.local_epochs=1", "algorithm.peers=2", "algorithm.k0=2"),
    "ditto": ("algorithm.local_epochs=1", "algorithm.peers=2"),
    "dispfl": ("algorithm.local_epochs=1", "algorithm.peers=2"),
    "fedfomo": ("algorithm.local_epochs=1", "algorithm.peers=2"),
    "hist": (*HIST, "model.options.dropout=0.5"),
    "hfedavg": (
        "model.name=fcnn",
        "algorithm.cells=2",
        "algorithm.edge_rounds=2",
        "algorithm.local_steps=3",
        "partition.num_clients=8",
    ),
    "fedavg_deadline": (
        "algorithm.fraction=0.5",
        "algorithm.deadline_s=0.2",
        "algorithm.late=partial",
        "algorithm.over_select=0.4",
        "system.devices.cpu_hz=[1e7, 1e8]",
        "system.devices.availability=0.8",
    ),
    "fedbuff": ("algorithm.fraction=0.5", "algorithm.buffer_size=2", "system.devices.cpu_hz=[1e7, 1e8]"),
    "fedasync": ("algorithm.fraction=0.5", "system.devices.cpu_hz=[1e7, 1e8]"),
    "cse_fsl_async": (
        *LENET,
        "algorithm.h=2",
        "algorithm.participation=without_replacement",
        "algorithm.clients_per_round=4",
        "algorithm.buffer_size=2",
        "system.devices.cpu_hz=[1e7, 1e8]",
    ),
}

# further branches of the same algorithms: (case name, algorithm, extra keys)
VARIANTS: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "fedavg-fp16",
        "fedavg",
        (
            "algorithm.codec_up=fp16",
            "algorithm.codec_down=fp16",
            "algorithm.optimizer.momentum=0.9",
            "algorithm.optimizer.weight_decay=0.001",
        ),
    ),
    (
        "splitfed_v2-client_after_client",
        "splitfed_v2",
        (*LENET, "algorithm.server_order=client_after_client"),
    ),
    (
        "splitfed_v1-replacement",
        "splitfed_v1",
        (
            *LENET,
            "algorithm.participation=with_replacement",
            "algorithm.clients_per_round=4",
            "algorithm.agg_every=3",
        ),
    ),
    (
        "fsl_an-local-aux",
        "fsl_an",
        (*LENET, "algorithm.aggregate_aux=false", "algorithm.copies_eval=copy0", "algorithm.codec_up=fp16"),
    ),
    (
        "cse_fsl-theory",
        "cse_fsl",
        (
            *LENET,
            "algorithm.server_trigger=every_l_rounds",
            "algorithm.local_steps=3",
            "algorithm.zb_step=server_backprop",
            "algorithm.participation=with_replacement",
            "algorithm.clients_per_round=4",
            "algorithm.global_lr=0.5",
        ),
    ),
    (
        "cse_fsl-post-step",
        "cse_fsl",
        (
            *LENET,
            "algorithm.h=3",
            "algorithm.smashed_from=post_step",
            "algorithm.drop_incomplete_block=true",
            "algorithm.init=normal0.05",
            "algorithm.lr_decay=0.5",
            "algorithm.lr_decay_every=1",
        ),
    ),
    (
        "light_fedsl-sparse",
        "light_fedsl",
        (
            "model.name=mlp",
            "model.cut=1",
            "rounds=4",
            "algorithm.agg_interval=2",
            "algorithm.model_codec=sparse",
            "algorithm.quant_granularity=tensor",
            "algorithm.codec_up=fp16",
        ),
    ),
    (
        "afind-standard-head",
        "afind",
        (
            "algorithm.local_epochs=1",
            "algorithm.peers=2",
            "algorithm.k0=2",
            "algorithm.neighbor_mode=standard",
            "algorithm.personal=head",
            "algorithm.topology.kind=ring",
        ),
    ),
    (
        "afind-dp-alternating",
        "afind",
        (
            "algorithm.local_epochs=2",
            "algorithm.k0=2",
            "algorithm.peers=2",
            "algorithm.local_update=alternating",
            "algorithm.dp.sigma=1.0",
            "algorithm.aggregation=uniform",
            "algorithm.selection=topk",
        ),
    ),
    (
        "ditto-afind",
        "ditto",
        ("algorithm.local_epochs=1", "algorithm.peers=2", "algorithm.peer_selection=afind"),
    ),
    (
        "dispfl-afind",
        "dispfl",
        ("algorithm.local_epochs=1", "algorithm.peers=2", "algorithm.peer_selection=afind"),
    ),
    (
        "hist-aircomp-optimised",
        "hist",
        (
            *HIST,
            "model.options.dropout=0.5",
            "algorithm.aggregation=aircomp",
            "algorithm.mask_sizes=optimised",
            "algorithm.form=masked",
        ),
    ),
    ("hist-no-dropout", "hist", HIST),
    ("fsl_an-no-dropout", "fsl_an", (*LENET, "algorithm.server_order=random")),
    (
        "hfedavg-lenet-cell_iid",
        "hfedavg",
        (
            *LENET,
            "model.cut=null",
            "algorithm.cells=2",
            "algorithm.edge_rounds=2",
            "algorithm.local_steps=3",
            "partition.num_clients=8",
            "algorithm.split=cell_iid",
        ),
    ),
]


def algorithm_cases() -> list[Case]:
    """Every registered algorithm, small, once per executor."""
    from fedge.algorithms import ALGORITHMS

    missing = sorted(set(ALGORITHMS) - set(ALGORITHM_SETTINGS))
    if missing:
        raise SystemExit(f"no golden settings for {', '.join(missing)}: add them to ALGORITHM_SETTINGS")
    runs = [(name, name, ALGORITHM_SETTINGS[name]) for name in sorted(ALGORITHMS)] + VARIANTS
    return [
        Case(
            f"{case}-{executor}",
            None,
            (*SMALL, f"algorithm.name={name}", f"engine.executor={executor}", *keys),
        )
        for case, name, keys in runs
        for executor in ("sequential", "batched")
    ]


def suites(name: str) -> dict[str, list[Case]]:
    chosen = {"examples": EXAMPLES, "algorithms": None}
    names = list(chosen) if name == "all" else [name]
    return {n: (algorithm_cases() if n == "algorithms" else chosen[n]) for n in names}


def run_case(case: Case, out: Path) -> dict[str, Any]:
    """Run ``case`` in ``out``; its rows (wall clock dropped), summary and ledger hash."""
    import fedge
    from fedge.config import load_raw

    raw = load_raw(ROOT / case.config if case.config else None)
    for key in case.drop:
        raw["algorithm"].pop(key)
    overrides = [*case.overrides, f"output.dir={out}", f"output.name={case.name}", "output.plots=false"]
    result = fedge.run(raw, overrides)
    evaluated = [row for row in result.metrics if "accuracy" in row]  # rounds without evaluation add rows
    rows = [{k: v for k, v in row.items() if k not in WALL_CLOCK} for row in evaluated]
    summary = {k: v for k, v in result.summary.items() if k not in WALL_CLOCK}
    ledger = (result.run_dir / "ledger.csv").read_bytes()
    return {
        "overrides": list(case.overrides),
        "rows_sha256": digest(rows),
        "ledger_sha256": hashlib.sha256(ledger).hexdigest(),
        "rows": rows,
        "summary": summary,
    }


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def by_design(case: str) -> tuple[frozenset[str] | None, list[str]]:
    """The fields of ``case`` changed on purpose (None: every field) and the reasons."""
    fields: set[str] = set()
    reasons = []
    for patterns, changed, reason in CHANGED_BY_DESIGN:
        if any(fnmatch.fnmatch(case, pattern) for pattern in patterns):
            if changed is None:
                return None, [reason]
            fields |= changed
            reasons.append(reason)
    return frozenset(fields), reasons


def rounding(case: str) -> tuple[float, list[str]]:
    """The relative tolerance ``case`` is checked within (0: exact) and the reasons."""
    tolerance, reasons = 0.0, []
    for patterns, allowed, reason in ROUNDED_BY_DESIGN:
        if any(fnmatch.fnmatch(case, pattern) for pattern in patterns):
            tolerance = max(tolerance, allowed)
            reasons.append(reason)
    return tolerance, reasons


def without(value: Any, fields: frozenset[str]) -> Any:
    """``value`` with the keys ``fields`` dropped at every depth."""
    if isinstance(value, dict):
        return {k: without(v, fields) for k, v in value.items() if k not in fields}
    if isinstance(value, list):
        return [without(v, fields) for v in value]
    return value


def added(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Fields of the rows and the summary that ``actual`` has and the recording has not (new outputs:
    reported, not compared)."""
    def keys(case: dict[str, Any]) -> set[str]:
        rows = {f"rows.{k}" for row in case["rows"] for k in row}
        return rows | {f"summary.{k}" for k in case["summary"]}

    return sorted(keys(actual) - keys(expected))


def differences(expected: Any, actual: Any, tolerance: float, path: str = "") -> list[str]:
    """Every place where ``actual`` differs from ``expected`` (fields only in ``actual`` are not compared:
    :func:`added` lists them)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected a mapping"]
        out = []
        for key, value in expected.items():
            if key not in actual:
                out.append(f"{path}.{key}: missing")
            else:
                out.extend(differences(value, actual[key], tolerance, f"{path}.{key}"))
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {len(expected)} entries"]
        return [
            d
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for d in differences(e, a, tolerance, f"{path}[{i}]")
        ]
    if isinstance(expected, float) and isinstance(actual, int | float):
        same = expected == actual or (math.isnan(expected) and math.isnan(actual))
        if same or abs(expected - actual) <= tolerance * max(1.0, abs(expected)):
            return []
        return [f"{path}: {expected!r} -> {actual!r}"]
    return [] if expected == actual else [f"{path}: {expected!r} -> {actual!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["record", "check"])
    parser.add_argument("--suite", choices=["examples", "algorithms", "all"], default="all")
    parser.add_argument("--only", nargs="*", help="case names (default: every case of the suite)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="relative tolerance of check")
    parser.add_argument("--baseline", type=Path, help="recordings folder of this machine (exact check)")
    parser.add_argument("--ignore", nargs="*", default=[], help="fields left out of a baseline check")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    failed = 0
    for suite, cases in suites(args.suite).items():
        path = (args.baseline or GOLDEN) / f"{suite}.json"
        stored = json.loads(path.read_text()) if path.exists() else {}
        for case in cases:
            if args.only and case.name not in args.only:
                continue
            began = time.perf_counter()
            with tempfile.TemporaryDirectory() as out:
                got = run_case(case, Path(out))
            seconds = time.perf_counter() - began
            if args.action == "record":
                stored[case.name] = got
                print(f"recorded {suite}/{case.name} ({seconds:.1f} s)", flush=True)
                continue
            if case.name not in stored:
                print(f"MISSING  {suite}/{case.name}: not recorded", flush=True)
                failed += 1
                continue
            changed, reasons = by_design(case.name)
            if args.baseline:
                changed, reasons = frozenset(args.ignore), ["--ignore"]
            if changed is None:
                print(f"changed  {suite}/{case.name} by design: {reasons[0]}", flush=True)
                continue
            expected = stored[case.name]
            allowed, rounded = (0.0, []) if args.baseline else rounding(case.name)
            tolerance = max(args.tolerance, allowed)
            diffs = differences(without(expected["rows"], changed), got["rows"], tolerance, "rows")
            diffs += differences(without(expected["summary"], changed), got["summary"], tolerance, "summary")
            if "ledger" not in changed and expected["ledger_sha256"] != got["ledger_sha256"]:
                diffs.append("ledger.csv differs")
            status = "same" if not diffs else "DIFFERS"
            note = f"; {', '.join(sorted(changed))} left out: {' / '.join(reasons)}" if changed else ""
            note += f"; within {allowed:g}: {' / '.join(rounded)}" if allowed else ""
            new = added(expected, got)
            note += f"; added {', '.join(new)}" if new else ""
            print(f"{status:8} {suite}/{case.name} ({seconds:.1f} s){note}", flush=True)
            for line in diffs[:8]:
                print(f"         {line}")
            failed += bool(diffs)
        if args.action == "record":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    if args.action == "check":
        print("all same" if not failed else f"{failed} case(s) differ")
        if failed and not args.baseline:
            print(
                "(if the code before your change differs too, this processor rounds unlike the recording's:"
                " compare against a --baseline of this machine, see --help)"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
