"""``fedge bounds``: evaluate the papers' convergence bounds for a setting, or tabulate them over knobs.

CONFIG is a theory file (a ``theory:`` block with a paper's constants and knobs), or a run config whose
settings and estimated constants give the SplitFed bounds (see :mod:`fedge.empirical.from_run`), or nothing
(the SplitFed theory paper's bounds at unit constants, L = sigma_L^2 = sigma_G^2 = delta_F = 1).
``--sweep key=v1,v2,...`` re-evaluates for each value (repeat the option for a grid); keys are dotted, e.g.
``theory.K=1,5,20`` or ``partition.alpha=0.1,1``.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from fedge.config import apply_override, load_raw, split_values
from fedge.errors import ConfigError, FedgeError
from fedge.intake.locate import config_source
from fedge.intake.precheck import precheck

if TYPE_CHECKING:  # the theory modules import torch: loaded when a bound is evaluated, not for --help
    from fedge.theory.bound import Bound

UNIT_SETTING = {
    "paper": "sfl",
    "L": 1.0,
    "sigma_L2": 1.0,
    "sigma_G2": 1.0,
    "delta_F": 1.0,
    "T": 1000,
    "K": 5,
    "l": 2,
    "m": 20,
}

console = Console()
errors = Console(stderr=True)


def parse_sweep(option: str) -> tuple[str, list[str]]:
    """``key=v1,v2,...`` to the key and its values."""
    if "=" not in option:
        raise ConfigError("--sweep", f"must look like key=v1,v2,... (got {option!r})")
    key, text = option.split("=", 1)
    values = split_values(text)
    if not key.strip() or not values:
        raise ConfigError("--sweep", f"needs a key and at least one value (got {option!r})")
    return key.strip(), values


class Evaluator:
    """Resolves raw config dicts to bounds, estimating a run's constants once per distinct run config."""

    def __init__(self, probe: int | None, label: str = "theory block"):
        self.probe = probe
        self.label = label
        self.cache: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}

    def __call__(self, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[Bound]]:
        from fedge.empirical.from_run import sfl_inputs_from_run
        from fedge.extend import parse_config
        from fedge.theory.inputs import parse_inputs

        raw = copy.deepcopy(raw)
        theory = raw.pop("theory", None) or {}
        if not isinstance(theory, dict):
            raise ConfigError("theory", "must be a block of keys")
        if raw:
            key = yaml.safe_dump(raw, sort_keys=True)
            if key not in self.cache:
                config = parse_config(raw)
                if config.engine.threads is None:
                    import torch

                    torch.set_num_threads(1)  # small models estimate fastest on one thread
                self.cache[key] = sfl_inputs_from_run(config, {}, probe=self.probe)
            derived, source = self.cache[key]
            theory_raw = {**derived, **theory}
            source = {**source, **{k: self.label for k in theory}}
        else:
            theory_raw, source = theory, {k: self.label for k in theory}
        inputs = parse_inputs(theory_raw)
        return inputs.describe(), source, inputs.evaluate()


def _cell(bound: Bound) -> str:
    if math.isinf(bound.value):
        return "inf"
    text = f"{bound.value:.4g}"
    return f"{text} (vacuous)" if bound.vacuous else text


def _print_single(described: dict[str, Any], source: dict[str, str], bounds: list[Bound]) -> None:
    inputs = Table(title="inputs", show_header=False, title_justify="left")
    for key, value in described.items():
        if value is not None:
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            inputs.add_row(key, shown, source.get(key, "default or rule"))
    console.print(inputs)
    table = Table(title="bounds", title_justify="left")
    for column in ("bound", "value", "status", "terms"):
        table.add_column(column)
    for b in bounds:
        terms = ", ".join(f"{k} {v:.3g}" for k, v in b.terms.items())
        table.add_row(b.name, _cell(b), f"vacuous: {b.reason}" if b.vacuous else "conditions met", terms)
    console.print(table)


def _print_sweep(keys: list[str], rows: list[tuple[tuple[str, ...], list[Bound]]]) -> None:
    names = [b.name for b in rows[0][1]]
    table = Table(title="bounds over the sweep ((vacuous): a condition fails, see the last column)")
    for column in (*keys, *names, "vacuous because"):
        table.add_column(column, justify="right" if column in names else "left")
    for values, bounds in rows:
        reasons = "; ".join(f"{b.name.split('.', 1)[-1]}: {b.reason}" for b in bounds if b.vacuous)
        table.add_row(*values, *(_cell(b) for b in bounds), reasons)
    console.print(table)


def bounds(
    config: Annotated[
        str | None,
        typer.Argument(help="theory YAML, a run config or example:NAME (omit for the SplitFed unit setting)"),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides, e.g. theory.K=10 or rounds=500")
    ] = None,
    sweep: Annotated[
        list[str] | None, typer.Option("--sweep", help="key=v1,v2,... ; repeat the option for a grid")
    ] = None,
    probe: Annotated[int, typer.Option(help="samples per client when estimating a run's constants")] = 512,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
) -> None:
    """Print the papers' convergence bounds for a setting, or tabulate them over a sweep."""
    overrides = list(overrides or [])
    if config is not None and "=" in config and not Path(config).exists():
        config, overrides = None, [config, *overrides]
    try:
        raw = load_raw(config_source(config)) if config is not None else {"theory": dict(UNIT_SETTING)}
        for assignment in overrides:
            apply_override(raw, assignment)
        evaluate = Evaluator(probe, "theory block" if config is not None else "SplitFed unit setting")
        sweeps = [parse_sweep(option) for option in sweep or []]
        keys = [key for key, _ in sweeps]
        points = []
        for values in itertools.product(*(v for _, v in sweeps)):
            point = copy.deepcopy(raw)
            for key, value in zip(keys, values, strict=True):
                apply_override(point, f"{key}={value}")
            points.append((values, point))
        for _, point in points:  # every run config checked before torch loads to estimate constants
            run_part = {key: value for key, value in point.items() if key != "theory"}
            if run_part:
                precheck(run_part)
        results = [(values, *evaluate(point)) for values, point in points]
    except FedgeError as error:
        errors.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    if as_json:
        payload = [
            {
                "sweep": dict(zip(keys, values, strict=True)),
                "inputs": described,
                "bounds": [b.__dict__ for b in found],
            }
            for values, described, _, found in results
        ]
        typer.echo(json.dumps(payload, indent=1))
    elif sweeps:
        _print_sweep(keys, [(values, found) for values, _, _, found in results])
    else:
        _, described, source, found = results[0]
        _print_single(described, source, found)
