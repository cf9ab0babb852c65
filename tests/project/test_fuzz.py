"""A property-based fuzzer of the command line: configs generated from the config schema and broken.

Each example takes one algorithm's tiny config, walks its schema (every key of every block, the algorithm's
own class included), and sets one to three keys to values that break them (NaN, infinities, negative, zero,
huge, fractional, true/false, wrong types, unsafe names, unknown or misspelt keys) or to other valid values,
through the YAML file or as ``key=value`` overrides. The property: ``fedge run`` ends in exit code 2 with
one ``error:`` line and no run directory, or in a finished run with a valid, finite summary, or in a
divergence stopped with exit code 3; never in a traceback. The number of examples is bounded for CI
and replayed (``FEDGE_FUZZ_EXAMPLES=n`` draws n fresh ones); test_bad_input_sweep.py enumerates cases.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from cases import ALGORITHM_NAMES, check_outcome, invoke, leaves, set_key, tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FEDGE_FUZZ_EXAMPLES", "40"))
EXPLORE = "FEDGE_FUZZ_EXAMPLES" in os.environ  # a chosen count draws fresh examples; CI replays fixed ones
NUMBER_BREAKERS = [math.nan, math.inf, -math.inf, -1, 0, -0.5, 2.5, 10**30, 1e300, 1e-300, True, "7x"]
OTHER_BREAKERS = [None, "", "nope", "a\x00b", [], {}, [1, "x"], "../up", "x" * 300, -3]
# valid values that would make an example slow (a full dataset, torch.compile) or need absent files
VALID_ONLY = {
    "data.name": ["digits", "synthetic"],
    "engine.compile": [False],
    "engine.device": ["cpu", "cuda", "meta", "mps", "cpu:0"],
    "data.root": ["/nonexistent"],
    "model.options": [{}, {"hidden": [8, 4]}, {"hidden": []}, {"bogus": 1}, {"hidden": [0]}],
    "model.name": ["mlp", "fcnn", "lenet5", "nope"],
}


def _admitted(annotation: Any) -> tuple[set[Any], list[Any]]:
    """The scalar types an annotation admits and the choices of its literals."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return {type(arg) for arg in args}, list(args)
    if origin is None:
        return {annotation}, []
    if origin is typing.Annotated:
        return _admitted(args[0])
    types, choices = set(), []
    for arg in args:
        if arg is not Ellipsis:
            more, options = _admitted(arg)
            types |= more
            choices += options
    return types | {origin}, choices


def values_for(key: str, annotation: Any, valid: bool) -> st.SearchStrategy:
    """Valid-looking values of a key's type, or values that break it."""
    if key in VALID_ONLY and valid:
        return st.sampled_from(VALID_ONLY[key])
    types, choices = _admitted(annotation)
    if not valid:
        numeric = bool(types & {int, float})
        return st.sampled_from(NUMBER_BREAKERS if numeric else OTHER_BREAKERS)
    if choices:
        return st.sampled_from(choices)
    if bool in types:
        return st.booleans()
    if list in types or tuple in types:
        return st.sampled_from([[1, 6, 6], [0.5], [1], []])
    if float in types:
        return st.sampled_from([0.01, 0.1, 0.5, 0.9, 1.0, 3.0])
    if int in types:
        return st.integers(min_value=1, max_value=4)
    return st.sampled_from(["x", "run-1"])


def _misspelt(key: str, draw) -> str:
    *path, last = key.split(".")
    cut = draw(st.integers(min_value=0, max_value=max(len(last) - 1, 0)))
    return ".".join([*path, last[:cut] + last[cut + 1 :] or "x"])


@st.composite
def broken_runs(draw) -> tuple[str, dict[str, Any], list[str]]:
    """An algorithm, its config with some keys broken or changed, and overrides for the command line."""
    algorithm = draw(st.sampled_from(ALGORITHM_NAMES))
    keys = leaves(algorithm)
    config = tiny(algorithm, Path("unset"), rounds=1)
    overrides = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        key, annotation = draw(st.sampled_from(keys))
        how = draw(st.sampled_from(["break", "break", "valid", "misspell"]))
        value = draw(values_for(key, annotation, valid=how == "valid"))
        if how == "misspell":
            key = _misspelt(key, draw)
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        if draw(st.booleans()) and "\x00" not in text and "\n" not in text:
            overrides.append(f"{key}={text}")
        else:
            set_key(config, key, value)
    return algorithm, config, overrides


@pytest.mark.ci
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not EXPLORE,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(broken_runs())
def test_no_input_gets_a_traceback_or_a_half_made_directory(case):
    algorithm, config, overrides = case
    root = Path(tempfile.mkdtemp(prefix="fedge-fuzz-"))
    try:
        out = root / "runs"
        config["output"]["dir"] = str(out)
        path = root / "run.yaml"
        path.write_text(yaml.safe_dump(config))
        outcome = invoke(["run", str(path), *overrides, "-q"])
        check_outcome(outcome, out, f"{algorithm} {overrides} {config}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
