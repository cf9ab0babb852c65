"""The reproduction sweeps validate, and ``examples/paired.py`` pairs runs by seed within a group."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from tiers import parametrize_first_by_default

from fedge.experiments.sweep import load_sweep, paired_text, plan

EXAMPLES = Path(__file__).parents[2] / "examples"


@parametrize_first_by_default(
    ("name", "runs"),
    [("hist-lenet-table1", 8), ("afind-closest", 36), ("afind-table1", 90), ("afind-factors", 144)],
)
def test_reproduction_sweeps_validate_every_cell(name, runs):
    base, spec = load_sweep(f"example:sweeps/{name}")
    _, tasks = plan(base, spec)
    assert len(tasks) == runs


@pytest.mark.ci
def test_closest_afind_setup_is_the_papers_where_it_claims_to_be():
    base, spec = load_sweep("example:sweeps/afind-closest")
    _, tasks = plan(base, spec)
    afind = next(t.cell.raw for t in tasks if t.cell.raw["algorithm"]["name"] == "afind")
    gossip = next(t.cell.raw for t in tasks if t.cell.raw["algorithm"]["name"] == "gossip")
    assert afind["partition"]["num_clients"] == 100 and afind["model"]["name"] == "cnn2"
    assert afind["algorithm"]["k0"] == 10 and gossip["algorithm"]["peers"] == 10
    assert afind["algorithm"]["local_epochs"] == gossip["algorithm"]["local_epochs"] == 5


def _example(name: str):
    """The example script ``examples/<name>.py`` as a module (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paired():
    return _example("paired")


def _fake_run(root: Path, name: str, algorithm: str, accuracies: list[float], selected=None) -> None:
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"name": algorithm}}))
    (run / "summary.json").write_text(json.dumps({"status": "finished", "rounds": len(accuracies)}))
    rows = [{"round": t + 1, "accuracy": a} for t, a in enumerate(accuracies)]
    if selected is not None:
        for row in rows:
            row["selected_mean"] = selected
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_index(root, entries: list[dict]) -> None:
    """A sweep's index.csv of ``entries`` (label, seed, run)."""
    with (root / "index.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["label", "seed", "run"])
        writer.writeheader()
        writer.writerows(entries)


def test_paired_differences_are_per_seed_within_a_group(tmp_path):
    entries = []
    for seed, (a, g) in {7: (0.9, 0.8), 8: (0.7, 0.75)}.items():
        for algo, acc in (("afind", a), ("gossip", g)):
            name = f"small-{algo}-s{seed}"
            _fake_run(tmp_path, name, algo, [acc - 0.1, acc], selected=1.5 if algo == "afind" else None)
            entries.append({"label": f"small, {algo}", "seed": seed, "run": f"runs/{name}"})
    _fake_run(tmp_path, "big-gossip-s7", "gossip", [0.5])  # another group, no AFIND+ run: no pair
    entries.append({"label": "big, gossip", "seed": 7, "run": "runs/big-gossip-s7"})
    _write_index(tmp_path, entries)
    paired = _paired()
    result = paired.paired(paired.finished_runs(tmp_path), "afind", "best_accuracy")
    small = result["small"]
    assert small["differences"]["gossip"] == pytest.approx({7: 0.1, 8: -0.05})
    assert small["afind_selected"] == pytest.approx(1.5)
    assert result["big"]["differences"]["gossip"] == {}
    assert "s7: +10.00" in paired.markdown(result, "afind")


def test_a_kept_results_csv_pairs_like_its_sweep_and_mixes_with_a_live_sweep(tmp_path):
    kept = EXAMPLES.parent / "docs" / "results" / "afind-closest-s7.csv"
    paired = _paired()
    runs = paired.finished_runs(kept)
    with kept.open() as handle:
        rows = {(r["label"], int(r["seed"])): float(r["best_accuracy"]) for r in csv.DictReader(handle)}
    assert len(runs) == len(rows) == 12
    gossip = next(r for r in runs if r["group"] == "dir-0.1" and r["algorithm"] == "gossip")
    assert gossip["best_accuracy"] == rows[("dir-0.1, gossip", 7)] and gossip["selected"] is None
    _fake_run(tmp_path, "dir-0.1-afind-s10", "afind", [0.5, 0.9], selected=2.5)
    _fake_run(tmp_path, "dir-0.1-gossip-s10", "gossip", [0.85])
    _write_index(
        tmp_path,
        [{"label": f"dir-0.1, {a}", "seed": 10, "run": f"runs/dir-0.1-{a}-s10"} for a in ("afind", "gossip")],
    )
    result = paired.paired(runs + paired.finished_runs(tmp_path), "afind", "best_accuracy")
    afind_s7 = rows[("dir-0.1, afind", 7)]
    assert result["dir-0.1"]["differences"]["gossip"] == pytest.approx(
        {7: afind_s7 - gossip["best_accuracy"], 10: 0.05}
    )
    assert result["dir-0.1"]["afind_selected"] == pytest.approx(2.5)  # only the live run has a trace


def test_a_paired_difference_is_called_within_noise_only_when_its_interval_holds_zero():
    verdict = _paired().verdict
    assert verdict([0.01, -0.01, 0.005]).endswith("within noise")
    # 1, 1.2, 0.8 points: mean 1.0, std 0.2, t(2) = 4.303 -> half-width 0.497 points
    assert verdict([0.01, 0.012, 0.008]) == "[+0.50, +1.50] higher"
    assert verdict([-0.01, -0.012, -0.008]).endswith("lower")
    assert verdict([0.01]) == "-"


def test_the_shared_paired_verdict_gives_the_t_interval_and_names_one_seed():
    from fedge.experiments.sweep import paired_text, paired_verdict

    v = paired_verdict([1.0, 1.2, 0.8])
    # mean 1.0, sd 0.2, t(0.975, 2) = 4.303: half-width 4.303 * 0.2 / sqrt(3) = 0.497
    assert v["mean"] == pytest.approx(1.0)
    assert (v["low"], v["high"]) == pytest.approx((1.0 - 0.4969, 1.0 + 0.4969), abs=1e-4)
    assert v["verdict"] == "higher"
    assert paired_text([1.0, -1.0, 0.5]).endswith("within noise")
    assert paired_text([0.77]) == "+0.77 one seed"  # no "[+nan, +nan]" interval
    assert paired_verdict([2.0])["verdict"] == "one seed"


def test_a_cell_named_algorithm_dash_variant_is_paired_as_that_variant(tmp_path):
    entries = []
    for seed in (7, 8):
        for cell, algo, acc in (
            ("afind-tau-0.1", "afind", 0.9),
            ("afind-tau-0.5", "afind", 0.8),
            ("gossip", "gossip", 0.7),
        ):
            name = f"{cell}-s{seed}"
            _fake_run(tmp_path, name, algo, [acc], selected=4.0 if cell == "afind-tau-0.1" else None)
            entries.append({"label": f"{cell}, kind=dirichlet", "seed": seed, "run": f"runs/{name}"})
    _write_index(tmp_path, entries)
    paired = _paired()
    result = paired.paired(paired.finished_runs(tmp_path), "afind-tau-0.1", "best_accuracy")
    group = result["kind=dirichlet"]
    assert group["differences"]["gossip"] == pytest.approx({7: 0.2, 8: 0.2})
    assert group["differences"]["afind-tau-0.5"] == pytest.approx({7: 0.1, 8: 0.1})
    assert group["afind_selected"] == pytest.approx(4.0)


def test_hist_summary_pairs_seeds_and_tests_the_log_ratio(tmp_path):
    import argparse
    import math

    hist = _example("hist_experiments")
    # MB per client per round: HIST 1, HFedAvg 4; rounds to 70 % per seed
    rounds = {("hist", 1): 3, ("hist", 2): 4, ("hist", 3): 5, ("hfedavg", 1): 2, ("hfedavg", 2): 2}
    for (name, seed), needed in rounds.items():
        run = tmp_path / "fully_noniid" / f"s{seed}" / f"table1-{name}-n2"
        run.mkdir(parents=True)
        per_round = 1.0 if name == "hist" else 4.0
        rows = [
            {"round": t, "accuracy": 0.75 if t >= needed else 0.5, "client_up_mb": per_round * t}
            for t in range(1, needed + 1)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = argparse.Namespace(out=tmp_path, cells=[2], targets=[0.7], seeds=[1, 2, 3], sweeps=[])
    table = hist.summary(args)
    row = next(line for line in table.splitlines() if line.startswith("| 70% | fully_noniid | 2 |"))
    # HIST 3, 4, 5 MB (3 seeds); HFedAvg 8, 8 MB (seed 3 has no run, which is named): pairs (3, 8), (4, 8)
    assert "| 4.00 (3/3) | 8.00 (2/2); seed 3 not finished |" in row
    assert f"{math.sqrt(3 / 8 * 4 / 8):.2f} [" in row and "(0.38 / 0.50)" in row
    assert "2 seed(s)" not in row and "-4.50 [" in row
    # at equal traffic: seed 1's HFedAvg spent more than HIST's 3 MB in its first round (no pair), seed 2's
    # budget is HFedAvg's 4 MB, within which HIST reached 75 % and HFedAvg 50 %; seed 3 has no HFedAvg run
    equal = next(line for line in table.splitlines() if line.startswith("| fully_noniid | 2 |"))
    assert equal == "| fully_noniid | 2 | 4.0 | +25.00 one seed (+25.00) |"


def test_hist_summary_names_the_papers_figures_for_each_split(tmp_path):
    """Table I gives both splits: each row of the summary carries its own split's paper figures."""
    import argparse

    hist = _example("hist_experiments")
    for split in ("fully_noniid", "cell_iid"):
        for name in ("hist", "hfedavg"):
            run = tmp_path / split / "s1" / f"table1-{name}-n4"
            run.mkdir(parents=True)
            row = {"round": 1, "accuracy": 0.75, "client_up_mb": 1.0}
            (run / "metrics.jsonl").write_text(json.dumps(row))
    args = argparse.Namespace(out=tmp_path, cells=[4], targets=[0.7], seeds=[1], sweeps=[])
    table = hist.summary(args).splitlines()
    rows = {line.split(" | ")[1]: line for line in table if line.startswith("| 70% |")}
    assert rows["fully_noniid"].endswith("| 8.08, 20.28 |")
    assert rows["cell_iid"].endswith("| 3.32, 11.84 |")


def test_hist_summary_reads_sweep_runs_by_their_configs(tmp_path):
    """LeNet-5's Table I rows come from ``fedge sweep`` directories: each run is found by its own config
    (split, algorithm, N, seed), runs not finished are skipped, and a second sweep adds seeds to the same
    rows."""
    import argparse

    hist = _example("hist_experiments")
    # (sweep, split, name, seed, rounds to 70 %); MB per client per round: HIST 1, HFedAvg 2
    runs = [
        ("paper", "fully_noniid", "hist", 1, 2),
        ("paper", "fully_noniid", "hfedavg", 1, 2),
        ("paper", "fully_noniid", "hist", 2, 3),
        ("paper", "fully_noniid", "hfedavg", 2, None),  # pending: no config yet
        ("paper", "fully_noniid", "hist", 4, 1),  # killed after reaching 70 %: no summary
        ("more", "fully_noniid", "hist", 3, 4),
        ("more", "fully_noniid", "hfedavg", 3, 3),
    ]
    for sweep, split, name, seed, needed in runs:
        run = tmp_path / sweep / "runs" / f"{name}-s{seed}"  # a name that says nothing of split or N
        run.mkdir(parents=True)
        index = tmp_path / sweep / "index.csv"
        if not index.exists():
            index.write_text("cell,label,seed,run,state\n")
        with index.open("a") as handle:
            handle.write(f"{name},{name},{seed},runs/{name}-s{seed},done\n")
        if needed is None:
            continue
        config = {"seed": seed, "algorithm": {"name": name, "split": split, "cells": 2}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        per_round = 1.0 if name == "hist" else 2.0
        rows = [
            {"round": t, "accuracy": 0.75 if t >= needed else 0.5, "client_up_mb": per_round * t}
            for t in range(1, needed + 1)
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if seed != 4:
            (run / "summary.json").write_text(json.dumps({"status": "finished"}))
    found = hist.sweep_runs(tmp_path / "paper")
    assert set(found) == {
        ("fully_noniid", "hist", 2, 1),
        ("fully_noniid", "hfedavg", 2, 1),
        ("fully_noniid", "hist", 2, 2),
    }
    sweeps = [tmp_path / "paper", tmp_path / "more"]
    args = argparse.Namespace(out=tmp_path / "none", cells=[2], targets=[0.7], seeds=[1, 2, 3], sweeps=sweeps)
    row = next(
        line for line in hist.summary(args).splitlines() if line.startswith("| 70% | fully_noniid | 2 |")
    )
    # HIST 2, 3, 4 MB; HFedAvg 4 (seed 1), 6 (seed 3), seed 2 pending; pairs: seeds 1 and 3, ratios 0.50, 0.67
    assert "| 3.00 (3/3) | 5.00 (2/2); seed 2 not finished |" in row and "(0.50 / 0.67)" in row


def test_how_a_cell_moves_a_margin_is_paired_by_seed_against_the_baseline_cell():
    paired = _paired()
    result = {
        "small, kind=dirichlet": {"differences": {"gossip": {7: 0.01, 8: 0.02}}},
        "epochs-5, kind=dirichlet": {"differences": {"gossip": {7: 0.03, 8: 0.01, 9: 0.05}}},
        "epochs-5, kind=pathological": {"differences": {"gossip": {7: 0.03}}},  # no baseline group
    }
    rows = paired.moved(result, "small")
    assert [(group, name) for group, name, _ in rows] == [("epochs-5, kind=dirichlet", "gossip")]
    assert rows[0][2] == pytest.approx({7: 0.02, 8: -0.01})  # seed 9 has no baseline pair
    assert "s7: +2.00 / s8: -1.00" in paired.moved_markdown(rows, "afind", "small")


def _rows_run(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_hist_aircomp_is_paired_by_seed_against_oma(tmp_path):
    """Fig. 7(a) over seeds: OMA's final accuracy minus AirComp's, and AirComp's extra swing, per seed."""
    import argparse

    hist = _example("hist_experiments")
    finals = {"fig7a-oma": (0.75, 0.73, 0.74), "fig7a--20dB-paper": (0.64, 0.60, 0.66)}
    for name, per_seed in finals.items():
        for seed, final in zip((1, 2, 3), per_seed, strict=True):
            wobble = 0.04 if "dB" in name else 0.0  # AirComp swings 4 points over the last rounds, OMA none
            rows = [{"round": t, "accuracy": final - wobble * (t % 2)} for t in range(1, 11)]
            rows[-1]["accuracy"] = final
            _rows_run(tmp_path / f"s{seed}" / name, rows)
    args = argparse.Namespace(snr=[-20.0], normalisation=["paper"])
    table = hist.aircomp_paired(args, tmp_path, [1, 2, 3])
    row = next(line for line in table.splitlines() if line.startswith("| AirComp-HIST -20 dB"))
    # OMA - AirComp: 11, 13, 8 points (mean 10.67); swing 4 points more on every seed (no spread)
    assert "| 64.00 / 60.00 / 66.00 |" in row and "+10.67 [" in row and "] higher" in row
    assert row.endswith("| +4.00 [+4.00, +4.00] higher |")


def test_hist_latency_pairs_only_seeds_where_both_sizes_reach_the_target(tmp_path):
    import argparse

    hist = _example("hist_experiments")
    # (seconds per round, rounds to 75 %) per seed; seed 3's uniform run never reaches it
    runs = {"optimised": [(1.0, 4), (1.2, 5), (1.0, 4)], "uniform": [(1.5, 4), (1.5, 6), (1.5, None)]}
    for sizes, per_seed in runs.items():
        for seed, (per_round, needed) in enumerate(per_seed, start=1):
            rows = [
                {"round": t, "sim_seconds": per_round * t, "accuracy": 0.8 if t == needed else 0.5}
                for t in range(1, (needed or 8) + 1)
            ]
            _rows_run(tmp_path / f"s{seed}" / hist.latency_run("OMA-HIST", sizes), rows)
    table = hist.latency_paired(argparse.Namespace(target=0.75), tmp_path, [1, 2, 3]).splitlines()
    # uniform - optimised to 75 %: seed 1 6.0 - 4.0, seed 2 9.0 - 6.0; seed 3 is left out, and named
    assert "(2 of 3 seeds reached it with both) | 6.00 - 4.00 / 9.00 - 6.00 | +2.50 [" in table[2]
    # optimised / uniform - 1 per round: -33.3, -20.0, -33.3 %
    assert "| -33.3 / -20.0 / -33.3 | -28.89 [" in table[3]
    # at a target no run reaches, the per-round figure still stands and the time to it is a dash
    table = hist.latency_paired(argparse.Namespace(target=0.9), tmp_path, [1, 2, 3]).splitlines()
    assert "(0 of 3 seeds reached it with both) | - | - |" in table[2] and "-28.89 [" in table[3]


def test_light_fedsl_pairs_speed_for_fig3a_and_stability_for_fig2a():
    light = _example("light_fedsl_experiments")

    def curve(reach_at: int, wobble: float = 0.0) -> list[dict]:
        return [
            {"round": t, "accuracy": (0.96 if t >= reach_at else 0.5) + wobble * (t % 2)}
            for t in range(1, 21)
        ]

    fig3a = {"I=1": [curve(4), curve(5), curve(6)], "I=5": [curve(7), curve(9), curve(30)]}
    pairs = light.group_pairs("fig3a_dirichlet", fig3a)
    # I=5 - I=1 rounds to 95 %: 3 and 4 rounds; the third seed's I=5 never reaches 95 % and is named
    assert pairs["rounds to 95 %: I=5 - I=1"].startswith("+3.50 [")
    assert pairs["rounds to 95 %: I=5 - I=1"].endswith("(2 of 3 seeds reached it in both)")
    assert "I=1 - I=5" in pairs  # the final accuracy's pair stays
    fig2a = {"rho_f=0.35": [curve(1)] * 3, "rho_f=0.7": [curve(1, wobble=0.02)] * 3}
    noisier = light.group_pairs("fig2a_pair", fig2a)["fluctuation (pp): rho_f=0.7 - rho_f=0.35"]
    expected = 100 * (light.fluctuation(curve(1, wobble=0.02)) - light.fluctuation(curve(1)))
    assert expected > 1.5 and noisier == f"{expected:+.2f} [{expected:+.2f}, {expected:+.2f}] higher"


def test_light_fedsl_keeps_each_seeds_figures_so_its_intervals_can_be_checked():
    light = _example("light_fedsl_experiments")

    def curve(reach_at: int) -> list[dict]:
        return [
            {"round": t, "accuracy": 0.96 if t >= reach_at else 0.5, "sim_seconds": 0.1 * t, "mb_total": t}
            for t in range(1, 21)
        ]

    one, five = [curve(4), curve(5), curve(6)], [curve(7), curve(9), curve(30)]
    rows = {label: light.per_seed([3, 1, 2], runs) for label, runs in (("I=1", one), ("I=5", five))}
    assert [r["seed"] for r in rows["I=5"]] == [3, 1, 2]
    assert [r["round_to_95"] for r in rows["I=5"]] == [7, 9, None]  # never reached: None, not a mean
    pairs_by_seed = zip(rows["I=5"], rows["I=1"], strict=True)
    both = [a["round_to_95"] - b["round_to_95"] for a, b in pairs_by_seed if a["round_to_95"]]
    pairs = light.group_pairs("fig3a_dirichlet", {"I=1": one, "I=5": five})
    assert pairs["rounds to 95 %: I=5 - I=1"].startswith(paired_text(both))
