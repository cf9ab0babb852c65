"""The robustness issue's sweep, enumerated (slow): every algorithm's every config key set to values that
break it, the issue's named cases, and misspelt keys, each through ``fedge run``. Every case must end in a
one-line exit 2 with no directory, a finished run with a finite summary, or a divergence stopped with exit
3. ``python3 -m pytest -m slow -s tests/experiments/test_bad_input_sweep.py`` prints the tally.
"""

from __future__ import annotations

import collections
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases import ALGORITHM_NAMES, check_outcome, invoke, leaves, set_key, tiny

from tests.project.test_fuzz import _admitted

pytestmark = pytest.mark.slow

NUMBER_VALUES = [math.nan, math.inf, -math.inf, -1, 0, 10**30, 2.5, True, 1e300, 1e-300, 1e15]
OTHER_VALUES = [None, "nope", 5, [], "a\x00b"]
NAMED = [
    ("fedavg", {"output.name": "a/b"}),
    ("fedavg", {"output.name": ".."}),
    ("fedavg", {"output.name": "/abs/path"}),
    ("fedavg", {"output.name": "a\x00b"}),
    ("fedavg", {"output.name": "n" * 300}),
    ("fedavg", {"output.dir": "/dev/null/runs"}),
    ("fedavg", {"algorithm.batch_size": 10**12}),
    ("fedavg", {"data.num_train": 10**14}),
    ("fedavg", {"model.options": {"hidden": [10**12]}}),
    ("cse_fsl", {"algorithm.h": 1000}),
    ("pens", {"algorithm.keep": 50}),
    ("afind", {"algorithm.k0": 2, "algorithm.k_min": 9}),
    ("hist", {"model.options": {"hidden": []}}),
    ("hist", {"model.name": "cnn2", "data.shape": [1, 12, 12]}),
    ("fedavg", {"rounds": True}),
    ("splitfed_v1", {"algorithm.aggregate_divisor": "all_clients"}),
    ("fedavg", {"partition.alpha": math.inf}),
    ("fedavg", {"engine.device": "meta"}),
    ("fedavg", {"algorithm.optimizer.lr": 1e30}),
    ("fedavg", {"algorithm.optimizer.lr": 1e30, "stop.on_nonfinite": "continue"}),
]


# valid but endless: a thousand trillion rounds is a request, not an error (no time pre-flight exists)
ENDLESS = ("rounds", "algorithm.edge_rounds")


def cases() -> list[tuple[str, dict[str, Any]]]:
    """(algorithm, {key: value}) for every key of every algorithm's schema, plus the named cases."""
    found = list(NAMED)
    for algorithm in ALGORITHM_NAMES:
        for index, (key, annotation) in enumerate(leaves(algorithm)):
            types, _ = _admitted(annotation)
            values = NUMBER_VALUES if types & {int, float} and bool not in types else OTHER_VALUES
            if key in ENDLESS:
                values = [v for v in values if not isinstance(v, float) or not 1e6 < v < 1e38]
            found.append((algorithm, {key: values[index % len(values)]}))
            found.append((algorithm, {key: values[(index + 3) % len(values)]}))
            if index % 4 == 0:
                found.append((algorithm, {key + "s": 1}))
    return found


def test_every_case_is_refused_finished_or_stopped(capsys):
    tally: collections.Counter[str] = collections.Counter()
    for algorithm, changes in cases():
        root = Path(tempfile.mkdtemp(prefix="fedge-sweep-"))
        try:
            out = root / "runs"
            config = tiny(algorithm, out, rounds=2)
            for key, value in changes.items():
                set_key(config, key, value)
            if "output.dir" not in changes:
                config["output"]["dir"] = str(out)
            path = root / "run.yaml"
            path.write_text(yaml.safe_dump(config))
            tally[check_outcome(invoke(["run", str(path), "-q"]), out, f"{algorithm} {changes}")] += 1
        finally:
            shutil.rmtree(root, ignore_errors=True)
    with capsys.disabled():
        print(
            f"\n{sum(tally.values())} cases: {dict(tally)}; no traceback, no directory left, no NaN accepted"
        )
    assert tally["refused"] > 0 and tally["finished"] > 0 and tally["diverged"] > 0
