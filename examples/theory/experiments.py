"""The E-experiments at CPU scale: measured squared gradient norms next to the SplitFed bounds.

Two parts, both described by ``experiments.yaml`` next to this file:

- ``p1``: the oracle problem P1 (every constant exact), simulated by ``fedge.theory.oracle.simulate``
  over R replicates. Every row shows the theorems' quantity (``min over t = 0 mod l`` of the replicate
  mean of G_c / G_s), the fixed-step plateau (mean over the last 10% of rounds), and each applicable
  bound with its margin (bound / measured), ``FAILS`` when the measurement exceeds it, or ``vac.`` when a
  condition of the theorem fails (its formula value is still shown, as a prediction).
- ``digits``: the registered ``cse_fsl`` algorithm in the analysed form (``digits-cse-fsl.yaml``) with
  G_c / G_s measured every few rounds by ``fedge.empirical.metrics.global_grad_norms`` and averaged over
  seeds; the bounds at the constants estimated at the initial model (always vacuous at practical steps)
  and Theorem 1/2's leading-order form (a trend prediction, not a guarantee).

Usage: ``python examples/theory/experiments.py [p1|digits|all] [--only TEXT] [--out DIR]``; prints
markdown tables and writes (updates) ``<out>/<part>.json``. One thread, one process.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from fedge.config import apply_override, load_raw, parse_config
from fedge.empirical.from_run import CONSTANTS, sfl_inputs_from_run
from fedge.empirical.harness import measured_run
from fedge.empirical.metrics import global_grad_norms
from fedge.runner.loop import build_run
from fedge.theory import oracle, sfl, validate
from fedge.theory.bound import Bound
from fedge.theory.inputs import SflInputs, parse_inputs

HERE = Path(__file__).parent
MEASURE = functools.partial(global_grad_norms, sides=("client", "server"))
PROBLEM_KEYS = ("m", "sigma_G2")


def cases(experiment: dict[str, Any]) -> list[dict[str, Any]]:
    """The experiment's points: ``set`` merged into each ``cases`` entry or each ``vary`` combination."""
    common = experiment.get("set", {})
    if "cases" in experiment:
        return [{**common, **case} for case in experiment["cases"]]
    keys = list(experiment["vary"])
    grid = itertools.product(*(experiment["vary"][k] for k in keys))
    return [{**common, **dict(zip(keys, values, strict=True))} for values in grid]


def cell(bound: Bound | None, measured: float) -> str:
    """A bound as a table cell: its value and margin, FAILS, or vac. (a theorem condition fails)."""
    if bound is None:
        return "-"
    value = "inf" if math.isinf(bound.value) else f"{bound.value:.4g}"
    if bound.vacuous:
        return f"{value} vac."
    if measured > bound.value:
        return f"{value} FAILS"
    return f"{value} (x{bound.margin(measured):.3g})"


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "full" if value is None else str(value)


# ----- P1 ------------------------------------------------------------------------------------------------


def p1_run(problem: oracle.P1Problem, knobs: dict[str, Any]) -> oracle.P1Run:
    """Resolve the step rules of ``knobs`` (max / corollary / eta / nu) at P1's constants."""
    L, m, T, K, l, n = problem.client.L, problem.client.m, knobs["T"], knobs["K"], knobs["l"], knobs["n"]  # noqa: E741
    if "eta" in knobs:
        mu_L = knobs["eta"] / K
    elif knobs["mu_L"] == "max":
        mu_L = sfl.a_max(L, K, l)
    elif knobs["mu_L"] == "corollary":
        mu_L = sfl.corollary_client_step(L, K, l, T)
    else:
        mu_L = float(knobs["mu_L"])
    full = n is None
    if "nu" in knobs:
        mu = knobs["nu"] / m
    elif knobs["mu"] == "max":
        mu = sfl.thm3_step_cap(L, m) if full else sfl.thm4_step_cap(L, m)
    elif knobs["mu"] == "corollary":
        mu = sfl.corollary_server_step(L, m, T, 3 if full else 4)
    else:
        mu = float(knobs["mu"])
    return oracle.P1Run(T=T, K=K, l=l, mu_L=mu_L, mu=mu, n=n, replacement=knobs["replacement"])


def p1_row(spec: dict[str, Any], varied: dict[str, Any], replicates: int) -> dict[str, Any]:
    knobs = {**spec["base"], **varied}
    problem = oracle.make_p1(**{**spec["problem"], **{k: knobs[k] for k in PROBLEM_KEYS if k in knobs}})
    run = p1_run(problem, knobs)
    trace = oracle.simulate(problem, run, replicates=replicates, seed=spec["problem"]["seed"])
    checks = {c.bound.name: c for c in validate.sfl_checks(problem, run, trace)}
    g_c, g_s = trace.min_client(run.l), trace.min_server(run.l)

    def bound(*names: str) -> Bound | None:
        return next((checks[n].bound for n in names if n in checks), None)

    drift = validate.drift_ratios(problem, run, trace)
    return {
        **varied,
        "mu_L": run.mu_L,
        "mu": run.mu,
        "G_c min": g_c,
        "client bound": cell(bound("sfl.thm1", "sfl.thm2.corrected"), g_c),
        "Thm2 stated": cell(bound("sfl.thm2.stated"), g_c),
        "G_c plateau": trace.final_client(),
        "G_s min": g_s,
        "server bound": cell(bound("sfl.thm3", "sfl.thm4.stated"), g_s),
        "Thm4 n-subst.": cell(bound("sfl.thm4.n_substituted"), g_s),
        "G_s plateau": trace.final_server(),
        "drift/lemma c,s": f"{drift['client_drift']:.2g}, {drift['server_drift']:.2g}",
        "_checks": [
            {
                "bound": c.bound.name,
                "value": c.bound.value,
                "vacuous": c.bound.vacuous,
                "measured": c.measured,
            }
            for c in checks.values()
        ],
    }


def slope(x: list[float], y: list[float]) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def p1_summary(name: str, rows: list[dict[str, Any]], spec: dict[str, Any]) -> str:
    """Fitted trends for E1 (log-log slope in T) and E6 (plateau slope in sigma_G^2)."""
    if name.startswith("E1"):
        T = [r["T"] for r in rows]
        bounds = [next(c["value"] for c in r["_checks"] if c["bound"] == "sfl.thm1") for r in rows]
        return (
            f"log-log slope in T: measured min G_c {slope(T, [r['G_c min'] for r in rows]):.2f}, "
            f"Thm 1 {slope(T, bounds):.2f}; measured min G_s {slope(T, [r['G_s min'] for r in rows]):.2f}"
        )
    if name.startswith("E6"):
        L, m = spec["problem"]["h_max"] + spec["problem"]["beta"], spec["problem"]["m"]
        lines = []
        for n in sorted({r["n"] for r in rows}, key=lambda v: -1 if v is None else v):
            group = [r for r in rows if r["n"] == n]
            s2 = [r["sigma_G2"] for r in group]

            def fit(values: list[float], s2: list[float] = s2) -> float:
                return float(np.polyfit(s2, values, 1)[0])

            def bound_values(names: tuple[str, ...], group: list[dict[str, Any]] = group) -> list[float]:
                return [next(c["value"] for c in r["_checks"] if c["bound"] in names) for r in group]

            mu = group[0]["mu"]
            server = 13.2 * L * mu * m * m / (2 * m - 3) if n is None else 7 * L * mu * m * m / (m - 2)
            client = fit([r["G_c plateau"] for r in group])
            client_bound = fit(bound_values(("sfl.thm1", "sfl.thm2.corrected")))
            measured = fit([r["G_s plateau"] for r in group])
            lines.append(
                f"n = {fmt(n)}: plateau slope in sigma_G^2: client measured {client:.3g} vs bound "
                f"{client_bound:.3g}; server measured {measured:.3g} vs bound {server:.3g}"
            )
        return "\n".join(lines)
    return ""


def cse_fsl_table(spec: dict[str, Any], replicates: int) -> list[dict[str, Any]]:
    """CSE-FSL Propositions 1-2 on iid P1 (sigma_G^2 = 0) at their prescribed steps."""
    problem = oracle.make_p1(**{**spec["problem"], "sigma_G2": 0.0})
    rows = []
    for h, T in ((1, 1000), (5, 1000), (5, 250)):
        for check in validate.cse_fsl_checks(problem, h=h, T=T, replicates=replicates):
            rows.append(
                {
                    "h": h,
                    "T": T,
                    "bound": check.bound.name,
                    "quantity": check.quantity,
                    "measured": check.measured,
                    "bound value": cell(check.bound, check.measured),
                }
            )
    return rows


def run_p1(spec: dict[str, Any], only: str | None) -> dict[str, Any]:
    out = {}
    for name, experiment in spec["experiments"].items():
        if only and only not in name:
            continue
        began = time.perf_counter()
        rows = [p1_row(spec, varied, spec["replicates"]) for varied in cases(experiment)]
        print(
            f"\n### P1 {name} ({time.perf_counter() - began:.0f} s)\n\nprediction: {experiment['predicts']}\n"
        )
        print(markdown([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]))
        summary = p1_summary(name, rows, spec)
        if summary:
            print(f"\n{summary}")
        out[name] = {"rows": rows, "summary": summary}
    if not only or "CSE" in only:
        rows = cse_fsl_table(spec, spec["replicates"])
        print("\n### P1 CSE-FSL Propositions 1-2 (iid P1, prescribed steps)\n")
        print(markdown(rows))
        out["CSE-FSL"] = {"rows": rows}
    return out


# ----- digits through the registered cse_fsl -------------------------------------------------------------


def label(case: dict[str, Any]) -> str:
    """A case's overrides, short (``algorithm.`` dropped), or ``base``."""
    return ", ".join(f"{k.removeprefix('algorithm.')}={v}" for k, v in case.items()) or "base"


def series(rows: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    return np.array([r["round"] for r in rows]), np.array([r[key] for r in rows])


def digits_row(
    base: dict[str, Any],
    point: dict[str, Any],
    seeds: list[int],
    every: int,
    probe: int,
    cache: dict,
    runs: dict,
    labelled: bool,
) -> dict[str, Any]:
    """Mean over seeds of the measured G_c / G_s, next to the bounds at the estimated constants."""
    curves, accuracy = [], []
    for seed in seeds:
        raw = copy.deepcopy(base)
        for key, value in {**point, "seed": seed}.items():
            apply_override(raw, f"{key}={json.dumps(value)}")
        config = parse_config(raw)
        if seed == seeds[0]:
            settings = config
        key = config.to_yaml()
        if key not in runs:  # a point repeated across experiments (the base) runs once
            runs[key] = measured_run(build_run(config), every=every, measure=MEASURE)
        rows = runs[key]
        curves.append(rows)
        accuracy.append(rows[-1]["accuracy"])
    rounds, g_s = series(curves[0], "grad_sq_server")
    g_s = np.mean([series(c, "grad_sq_server")[1] for c in curves], axis=0)
    if "grad_sq_client" in curves[0][0]:
        g_c = np.mean([series(c, "grad_sq_client")[1] for c in curves], axis=0)
    else:  # no shared aux head: F^c is not defined at one global point
        g_c = np.full(len(rounds), np.nan)
    dumped = settings.model_dump(mode="json")
    key = yaml.safe_dump(
        {
            **{k: dumped[k] for k in ("seed", "data", "partition", "model")},
            "B": dumped["algorithm"]["batch_size"],
        },
        sort_keys=True,
    )
    if key not in cache:  # constants depend on data, model and batch size only: estimate once per kind
        estimated, _ = sfl_inputs_from_run(settings, {}, probe=probe)
        cache[key] = {k: estimated[k] for k in CONSTANTS if k in estimated}
    inputs = parse_inputs(sfl_inputs_from_run(settings, cache[key], probe=probe)[0])
    if not isinstance(inputs, SflInputs):
        raise TypeError("the digits experiments evaluate the sfl bounds")
    bounds = {b.name: b for b in inputs.evaluate()}
    l = inputs.l  # noqa: E741
    every_l = rounds % l == 0
    tail = rounds >= rounds.max() * 0.9
    client_bound = bounds.get("sfl.thm1") or bounds["sfl.thm2.corrected"]
    server_bound = bounds.get("sfl.thm3") or bounds["sfl.thm4.stated"]
    lead = (
        sfl.thm1_leading(
            L=inputs.L,
            sigma_L2=inputs.sigma_L2,
            sigma_G2=inputs.sigma_G2,
            delta_F=inputs.delta_F,
            a=inputs.client_step(),
            K=inputs.K,
            l=l,
            T=inputs.T,
        )
        if inputs.n is None
        else sfl.thm2_leading(
            L=inputs.L,
            sigma_L2=inputs.sigma_L2,
            sigma_G2=inputs.sigma_G2,
            delta_F=inputs.delta_F,
            a=inputs.client_step(),
            K=inputs.K,
            n=inputs.n,
            T=inputs.T,
        )
    )
    return {
        **({"case": label(point)} if labelled else point),
        "acc": float(np.mean(accuracy)),
        "G_c min": float(g_c[every_l].min()),
        "G_c mean": float(g_c.mean()),
        "G_c final": float(g_c[tail].mean()),
        "client bound": cell(client_bound, float(g_c[every_l].min())),
        "Thm1/2 leading": lead,
        "G_s min": float(g_s[every_l].min()),
        "G_s mean": float(g_s.mean()),
        "G_s final": float(g_s[tail].mean()),
        "server bound": cell(server_bound, float(g_s[every_l].min())),
        "L, sL2, sG2": f"{inputs.L:.3g}, {inputs.sigma_L2:.3g}, {inputs.sigma_G2:.3g}",
        "_curves": {"round": rounds.tolist(), "G_c": g_c.tolist(), "G_s": g_s.tolist()},
    }


def run_digits(spec: dict[str, Any], only: str | None) -> dict[str, Any]:
    base = load_raw(HERE / spec["config"])
    cache: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    out = {}
    for name, experiment in spec["experiments"].items():
        if only and only not in name:
            continue
        began = time.perf_counter()
        seeds = experiment.get("seeds", spec["seeds"])
        rows = [
            digits_row(
                base, point, seeds, spec["measure_every"], spec["probe"], cache, runs, "cases" in experiment
            )
            for point in cases(experiment)
        ]
        print(
            f"\n### digits / cse_fsl: {name} ({len(seeds)} seeds, {time.perf_counter() - began:.0f} s)\n\n"
            f"prediction: {experiment['predicts']}\n"
        )
        print(markdown([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]))
        out[name] = {"rows": rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["p1", "digits", "all"], nargs="?", default="all")
    parser.add_argument("--only", help="run only the experiments whose name contains this text")
    parser.add_argument("--out", type=Path, default=Path("runs/theory-experiments"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = yaml.safe_load((HERE / "experiments.yaml").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    for part, runner in (("p1", run_p1), ("digits", run_digits)):
        if args.part in (part, "all"):
            result = runner(spec[part], args.only)
            path = args.out / f"{part}.json"
            earlier = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps({**earlier, **result}, indent=1, default=str))


if __name__ == "__main__":
    main()
